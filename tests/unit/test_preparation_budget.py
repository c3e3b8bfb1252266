"""The ASGI frontend's preparation budget (handler/frontend/preparing.py): what a request's
preparation may take of the time, so a flood of requests refused on receipt cannot take the GIL
the step loop needs."""

from __future__ import annotations

import asyncio

import pytest

from handler.frontend.preparing import PreparationBudget, Preparer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_runs_at_once_then_preparation_waits_for_its_share():
    clock = Clock()
    budget = PreparationBudget(share=0.25, burst_s=0.1, clock=clock)
    assert budget.wait_s() == 0
    budget.spend(0.1)  # the burst, used up: not yet in debt
    assert budget.wait_s() == 0
    budget.spend(0.05)
    assert budget.wait_s() == pytest.approx(0.2)  # 0.05 s of CPU at a quarter of the time
    clock.now += 0.2
    assert budget.wait_s() == 0


def test_an_idle_budget_refills_to_its_burst_and_no_further():
    clock = Clock()
    budget = PreparationBudget(share=0.5, burst_s=0.1, clock=clock)
    budget.spend(0.3)
    clock.now += 1000.0
    budget.spend(0.1)
    assert budget.wait_s() == 0
    budget.spend(0.01)
    assert budget.wait_s() == pytest.approx(0.02)


@pytest.mark.parametrize("share", [0.0, -0.1, 1.5])
def test_a_share_outside_0_to_1_is_refused(share):
    with pytest.raises(ValueError, match="must be in"):
        PreparationBudget(share=share)


def test_the_preparer_charges_what_a_refused_preparation_took_and_nothing_for_a_served_one():
    budget = PreparationBudget(share=0.25, burst_s=0.0)
    preparer = Preparer(budget, threads=1)

    def busy(outcome: str) -> str:
        total = 0
        while total < 2_000_000:  # some CPU time, whatever the machine
            total += 1
        return outcome

    try:
        assert asyncio.run(preparer.run(lambda: busy("served"), refused=lambda r: r == "refused")) == "served"
        assert budget.wait_s() == 0  # served: nothing owed
        assert asyncio.run(preparer.run(lambda: busy("refused"), refused=lambda r: r == "refused")) == "refused"
        assert budget.wait_s() > 0  # its CPU time is owed: the next preparation waits
    finally:
        preparer.close()
