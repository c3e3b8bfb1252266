"""`make serve` starts only on a TorchServe that keeps token auth on and the model API off."""

import pytest

from scripts.serve import torchserve_compat


@pytest.mark.parametrize(("version", "secure"), [((0, 11, 0), False), ((0, 11, 1), False), ((0, 12, 0), True)])
def test_secure_defaults_start_with_torchserve_0_12(version, secure):
    assert torchserve_compat.has_secure_defaults(version) is secure


def test_the_serve_check_refuses_0_11_with_the_reason(monkeypatch, capsys):
    monkeypatch.setattr(torchserve_compat, "installed_version", lambda: (0, 11, 0))
    assert torchserve_compat.main(["require-secure-defaults"]) == 1
    message = capsys.readouterr().err
    assert "TorchServe 0.11.0" in message and "token authorization" in message and "0.12" in message


def test_the_serve_check_passes_on_the_installed_torchserve_only_if_it_is_0_12_or_newer(capsys):
    expected = 0 if torchserve_compat.installed_version() >= (0, 12) else 1
    assert torchserve_compat.main(["require-secure-defaults"]) == expected
