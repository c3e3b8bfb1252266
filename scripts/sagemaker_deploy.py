"""Create a SageMaker model, endpoint configuration and endpoint on an ml.inf2 instance.

The model data is the uncompressed S3 prefix from scripts/sagemaker_upload.py; the
container is the PyTorch Neuron DLC (TorchServe inside), configured through the TS_*
environment from serving/sagemaker.properties. The knobs are the seed deployment's:
volume size, model data download timeout, container startup health check timeout,
instance count; target-tracking autoscaling is optional.

    python scripts/sagemaker_deploy.py --model-data s3://my-bucket/llama-inf2/ \\
        --role-arn arn:aws:iam::111122223333:role/SageMakerRole --instance-type ml.inf2.xlarge --wait
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.sagemaker_common import check_name, container_environment, split_s3_uri

logger = logging.getLogger("sagemaker_deploy")

# The PyTorch Neuron inference DLC (AWS Deep Learning Containers, "pytorch-inference-neuronx").
# Pick the tag matching the Neuron SDK the model was compiled with (available_images in the
# DLC documentation lists them); --image-uri overrides the whole URI.
DLC_ACCOUNT = "763104351884"
DLC_REPOSITORY = "pytorch-inference-neuronx"
DEFAULT_DLC_TAG = "2.1.2-neuronx-py310-sdk2.20.2-ubuntu20.04"
VARIANT = "AllTraffic"
SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"


def dlc_image_uri(region: str, tag: str = DEFAULT_DLC_TAG) -> str:
    return f"{DLC_ACCOUNT}.dkr.ecr.{region}.amazonaws.com/{DLC_REPOSITORY}:{tag}"


@dataclass(frozen=True)
class Autoscaling:
    min_instances: int
    max_instances: int
    invocations_per_instance: float  # target for SageMakerVariantInvocationsPerInstance (per minute)
    scale_in_cooldown_s: int = 300
    scale_out_cooldown_s: int = 60

    def __post_init__(self) -> None:
        if not 1 <= self.min_instances <= self.max_instances:
            raise ValueError(f"autoscaling needs 1 <= min ({self.min_instances}) <= max ({self.max_instances})")
        if self.invocations_per_instance <= 0:
            raise ValueError("autoscaling target invocations per instance must be > 0")


@dataclass(frozen=True)
class Deployment:
    endpoint_name: str
    model_data: str
    role_arn: str
    image_uri: str
    instance_type: str = "ml.inf2.xlarge"
    instance_count: int = 1
    volume_size_gb: int = 64
    model_data_download_timeout_s: int = 3600
    startup_health_check_timeout_s: int = 600
    environment: dict[str, str] = field(default_factory=container_environment)
    autoscaling: Autoscaling | None = None

    def __post_init__(self) -> None:
        check_name(self.endpoint_name, "endpoint name")
        split_s3_uri(self.model_data)
        if not self.instance_type.startswith("ml.inf2."):
            raise ValueError(f"instance type '{self.instance_type}' is not an Inferentia2 instance (ml.inf2.*)")
        if self.instance_count < 1:
            raise ValueError("instance count must be at least 1")
        if not 1 <= self.volume_size_gb <= 512:
            raise ValueError(f"volume size must be 1-512 GB, got {self.volume_size_gb}")
        for name, value in (
            ("model data download timeout", self.model_data_download_timeout_s),
            ("container startup health check timeout", self.startup_health_check_timeout_s),
        ):
            if not 60 <= value <= 3600:
                raise ValueError(f"{name} must be 60-3600 s, got {value}")
        if self.autoscaling and self.autoscaling.min_instances > self.instance_count:
            raise ValueError("autoscaling min instances is above the initial instance count")

    @property
    def model_name(self) -> str:
        return self.endpoint_name

    @property
    def config_name(self) -> str:
        return self.endpoint_name


def model_request(d: Deployment) -> dict[str, Any]:
    bucket, prefix = split_s3_uri(d.model_data)
    return {
        "ModelName": d.model_name,
        "ExecutionRoleArn": d.role_arn,
        "PrimaryContainer": {
            "Image": d.image_uri,
            "ModelDataSource": {
                "S3DataSource": {
                    "S3Uri": f"s3://{bucket}/{prefix}",
                    "S3DataType": "S3Prefix",
                    "CompressionType": "None",
                }
            },
            "Environment": dict(d.environment),
        },
    }


def endpoint_config_request(d: Deployment) -> dict[str, Any]:
    return {
        "EndpointConfigName": d.config_name,
        "ProductionVariants": [
            {
                "VariantName": VARIANT,
                "ModelName": d.model_name,
                "InstanceType": d.instance_type,
                "InitialInstanceCount": d.instance_count,
                "VolumeSizeInGB": d.volume_size_gb,
                "ModelDataDownloadTimeoutInSeconds": d.model_data_download_timeout_s,
                "ContainerStartupHealthCheckTimeoutInSeconds": d.startup_health_check_timeout_s,
            }
        ],
    }


def resource_id(endpoint_name: str, variant: str = VARIANT) -> str:
    """Application Auto Scaling's name for an endpoint variant."""
    return f"endpoint/{endpoint_name}/variant/{variant}"


def deploy(sagemaker, d: Deployment, autoscaling_client=None, wait: bool = False) -> str:
    """Create model, endpoint config and endpoint (and autoscaling); returns the endpoint ARN."""
    sagemaker.create_model(**model_request(d))
    logger.info("model %s created", d.model_name)
    sagemaker.create_endpoint_config(**endpoint_config_request(d))
    logger.info("endpoint config %s created", d.config_name)
    arn = sagemaker.create_endpoint(EndpointName=d.endpoint_name, EndpointConfigName=d.config_name)["EndpointArn"]
    logger.info("endpoint %s creating (%s)", d.endpoint_name, arn)
    if wait or d.autoscaling:  # a scalable target needs the variant to exist: wait for InService
        started = time.monotonic()
        sagemaker.get_waiter("endpoint_in_service").wait(
            EndpointName=d.endpoint_name, WaiterConfig={"Delay": 30, "MaxAttempts": 120}
        )
        logger.info("endpoint %s in service after %.0f s", d.endpoint_name, time.monotonic() - started)
    if d.autoscaling:
        enable_autoscaling(autoscaling_client, d.endpoint_name, d.autoscaling)
    return arn


def enable_autoscaling(client, endpoint_name: str, scaling: Autoscaling) -> None:
    client.register_scalable_target(
        ServiceNamespace="sagemaker",
        ResourceId=resource_id(endpoint_name),
        ScalableDimension=SCALABLE_DIMENSION,
        MinCapacity=scaling.min_instances,
        MaxCapacity=scaling.max_instances,
    )
    client.put_scaling_policy(
        PolicyName=f"{endpoint_name}-invocations",
        ServiceNamespace="sagemaker",
        ResourceId=resource_id(endpoint_name),
        ScalableDimension=SCALABLE_DIMENSION,
        PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration={
            "TargetValue": scaling.invocations_per_instance,
            "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
            "ScaleInCooldown": scaling.scale_in_cooldown_s,
            "ScaleOutCooldown": scaling.scale_out_cooldown_s,
        },
    )
    logger.info("autoscaling %d-%d instances on %s", scaling.min_instances, scaling.max_instances, endpoint_name)


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--env takes KEY=VALUE, got '{pair}'")
        env[key] = value
    return env


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-data", required=True, help="s3://bucket/prefix/ from sagemaker_upload.py")
    parser.add_argument("--role-arn", required=True, help="SageMaker execution role (reads the model data)")
    parser.add_argument("--endpoint-name", default=None, help="default: inf2-llm-<timestamp>")
    parser.add_argument("--region", default=None)
    parser.add_argument("--image-uri", default=None, help=f"default: the {DLC_REPOSITORY}:{DEFAULT_DLC_TAG} DLC")
    parser.add_argument("--instance-type", default="ml.inf2.xlarge")
    parser.add_argument("--instance-count", type=int, default=1)
    parser.add_argument("--volume-size", type=int, default=64, help="GB of EBS for the model data")
    parser.add_argument("--model-data-download-timeout", type=int, default=3600, help="seconds")
    parser.add_argument("--container-startup-health-check-timeout", type=int, default=600, help="seconds")
    parser.add_argument("--env", action="append", default=[], help="extra container KEY=VALUE (repeatable)")
    parser.add_argument("--autoscale-max", type=int, default=0, help="enable autoscaling up to this many instances")
    parser.add_argument("--autoscale-min", type=int, default=1)
    parser.add_argument("--autoscale-target", type=float, default=60.0, help="invocations per instance per minute")
    parser.add_argument("--wait", action="store_true", help="wait until the endpoint is InService")
    return parser.parse_args(argv)


def deployment_from_args(args: argparse.Namespace, region: str) -> Deployment:
    scaling = Autoscaling(args.autoscale_min, args.autoscale_max, args.autoscale_target) if args.autoscale_max else None
    return Deployment(
        endpoint_name=args.endpoint_name or f"inf2-llm-{time.strftime('%Y%m%d-%H%M%S')}",
        model_data=args.model_data,
        role_arn=args.role_arn,
        image_uri=args.image_uri or dlc_image_uri(region),
        instance_type=args.instance_type,
        instance_count=args.instance_count,
        volume_size_gb=args.volume_size,
        model_data_download_timeout_s=args.model_data_download_timeout,
        startup_health_check_timeout_s=args.container_startup_health_check_timeout,
        environment={**container_environment(), **_env_pairs(args.env)},
        autoscaling=scaling,
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import boto3

    session = boto3.session.Session(region_name=args.region)
    try:
        d = deployment_from_args(args, session.region_name or "us-east-1")
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    autoscaling = session.client("application-autoscaling") if d.autoscaling else None
    deploy(session.client("sagemaker"), d, autoscaling, wait=args.wait)
    print(d.endpoint_name)


if __name__ == "__main__":
    main()
