"""The archive served as the SageMaker container runs it (tests/support/sagemaker.py)."""

from tests.support.sagemaker import container

__all__ = ["container"]
