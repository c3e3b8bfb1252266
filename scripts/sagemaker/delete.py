"""Delete a SageMaker endpoint with its endpoint configuration, model(s) and autoscaling.

Everything is found from the endpoint itself, so the endpoint name is all it needs.
What is already gone is reported and skipped, so a half-finished deploy can be cleaned.

    python -m scripts.sagemaker.delete --endpoint-name inf2-llm-20261130-120000
"""

from __future__ import annotations

import argparse
import logging

from botocore.exceptions import ClientError

from scripts.sagemaker.deploy import SCALABLE_DIMENSION, resource_id

logger = logging.getLogger("sagemaker_delete")


def _missing(exc: ClientError) -> bool:
    error = exc.response.get("Error", {})
    return error.get("Code") in {"ValidationException", "ResourceNotFound", "ObjectNotFoundException"} and (
        "not find" in error.get("Message", "").lower() or "not found" in error.get("Message", "").lower()
    )


def _describe(call, **kwargs) -> dict | None:
    try:
        return call(**kwargs)
    except ClientError as exc:
        if _missing(exc):
            return None
        raise


def delete(sagemaker, endpoint_name: str, autoscaling=None, config_name: str | None = None) -> list[str]:
    """Delete what exists; returns what was deleted, e.g. ['endpoint:x', 'endpoint-config:x', 'model:x']."""
    deleted: list[str] = []
    endpoint = _describe(sagemaker.describe_endpoint, EndpointName=endpoint_name)
    config_name = endpoint["EndpointConfigName"] if endpoint else (config_name or endpoint_name)
    config = _describe(sagemaker.describe_endpoint_config, EndpointConfigName=config_name)
    models = [v["ModelName"] for v in config["ProductionVariants"]] if config else [endpoint_name]
    variants = [v["VariantName"] for v in config["ProductionVariants"]] if config else []

    if autoscaling is not None:
        for variant in variants:
            rid = resource_id(endpoint_name, variant)
            targets = autoscaling.describe_scalable_targets(ServiceNamespace="sagemaker", ResourceIds=[rid])
            if targets["ScalableTargets"]:
                autoscaling.deregister_scalable_target(
                    ServiceNamespace="sagemaker", ResourceId=rid, ScalableDimension=SCALABLE_DIMENSION
                )
                deleted.append(f"scalable-target:{rid}")
    if endpoint:
        sagemaker.delete_endpoint(EndpointName=endpoint_name)
        deleted.append(f"endpoint:{endpoint_name}")
    if config:
        sagemaker.delete_endpoint_config(EndpointConfigName=config_name)
        deleted.append(f"endpoint-config:{config_name}")
    for model in models:
        if _describe(sagemaker.describe_model, ModelName=model):
            sagemaker.delete_model(ModelName=model)
            deleted.append(f"model:{model}")
    for item in deleted:
        logger.info("deleted %s", item)
    if not deleted:
        logger.info("nothing to delete for %s", endpoint_name)
    return deleted


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint-name", required=True)
    parser.add_argument("--region", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import boto3

    session = boto3.session.Session(region_name=args.region)
    delete(session.client("sagemaker"), args.endpoint_name, session.client("application-autoscaling"))


if __name__ == "__main__":
    main()
