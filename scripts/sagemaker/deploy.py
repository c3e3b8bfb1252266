"""Create a SageMaker model, endpoint configuration and endpoint on an ml.inf2 instance.

The model data is the uncompressed S3 prefix from scripts/sagemaker/upload.py; the
container is the PyTorch Neuron DLC for the backend the model data was built for (its
model-config.yaml's handler.backend, or --backend): Neuron SDK 2.25 for neuronx, SDK 2.28 for
nxdi, both with TorchServe 0.11.0 inside; --image-uri picks another. It reads the archive's
sagemaker.properties (TS_CONFIG_FILE). The knobs are the seed deployment's: volume size,
model data download timeout, container startup health check timeout, instance count;
target-tracking autoscaling is optional.

--frontend asgi deploys the ASGI frontend instead (docs/frontends.md, "SageMaker bring your own
container"): the user's own image built from docker/Dockerfile.asgi (--image-uri, required), which
runs `serve` on the same model data with no TorchServe; its container needs no TS_CONFIG_FILE.

With --wait it returns once the model answers: InService alone is not enough, because
TorchServe 0.11's /ping says Healthy before the worker has loaded the model, so it then
sends a 1-token request to the endpoint until one is answered.

    python -m scripts.sagemaker.deploy --model-data s3://my-bucket/llama-inf2/ \\
        --role-arn arn:aws:iam::111122223333:role/SageMakerRole --instance-type ml.inf2.xlarge --wait
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
    WaiterError,
)

from scripts.sagemaker.common import (
    DLC_REPOSITORY,
    DLCS,
    MODEL_CONFIG_NAME,
    PROPERTIES_NAME,
    check_name,
    config_backend,
    config_task,
    container_environment,
    dlc_for,
    split_s3_uri,
)
from scripts.serve.client import readiness_body

logger = logging.getLogger("sagemaker_deploy")

# The PyTorch Neuron inference DLCs (scripts/sagemaker/common.py: DLCS): for neuronx the one for
# Neuron SDK 2.25, the last release with transformers-neuronx (Python 3.10, torch 2.7); for nxdi
# the SDK 2.28 one (Python 3.12, torch 2.9). Both run TorchServe 0.11.0. Artifacts compiled with
# another SDK do not load: pass that SDK's DLC with --image-uri.
# The Deep Learning Containers' ECR account per region, as AWS documents it ("Region
# availability" of the AWS Deep Learning Containers documentation). Whether a region also
# offers ml.inf2 instances is a separate question: CreateEndpointConfig answers it.
DLC_ACCOUNTS = {
    "us-east-1": "763104351884",
    "us-east-2": "763104351884",
    "us-west-1": "763104351884",
    "us-west-2": "763104351884",
    "af-south-1": "626614931356",
    "ap-east-1": "871362719292",
    "ap-east-2": "975050140332",
    "ap-south-1": "763104351884",
    "ap-south-2": "772153158452",
    "ap-southeast-1": "763104351884",
    "ap-southeast-2": "763104351884",
    "ap-southeast-3": "907027046896",
    "ap-southeast-4": "457447274322",
    "ap-southeast-5": "550225433462",
    "ap-southeast-6": "633930458069",
    "ap-southeast-7": "590183813437",
    "ap-northeast-1": "763104351884",
    "ap-northeast-2": "763104351884",
    "ap-northeast-3": "364406365360",
    "ca-central-1": "763104351884",
    "ca-west-1": "204538143572",
    "eu-central-1": "763104351884",
    "eu-central-2": "380420809688",
    "eu-west-1": "763104351884",
    "eu-west-2": "763104351884",
    "eu-west-3": "763104351884",
    "eu-south-1": "692866216735",
    "eu-south-2": "503227376785",
    "eu-north-1": "763104351884",
    "il-central-1": "780543022126",
    "mx-central-1": "637423239942",
    "me-south-1": "217643126080",
    "me-central-1": "914824155844",
    "me-west-1": "124382933778",
    "sa-east-1": "763104351884",
    "cn-north-1": "727897471807",
    "cn-northwest-1": "727897471807",
}
VARIANT = "AllTraffic"
SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
# The readiness probe: one token (one embedded word for an embedding archive), one JSON answer.
PROBE_BODY = json.dumps(readiness_body("generate"))
# Statuses from the container that no retry will change (a bad request, token auth left on).
FATAL_CONTAINER_STATUSES = {400, 401, 403, 405, 413, 415, 422}
RETRYABLE_ERRORS = {
    "ModelError",  # the container answered non-200 (no worker yet) or timed out (request queued behind the load)
    "ModelNotReadyException",
    "ServiceUnavailable",
    "InternalFailure",
    "InternalDependencyException",
    "ThrottlingException",
}
NETWORK_ERRORS = (ReadTimeoutError, ConnectTimeoutError, EndpointConnectionError, ConnectionClosedError)


FRONTENDS = ("torchserve", "asgi")


def asgi_environment() -> dict[str, str]:
    """The container environment of a --frontend asgi image (handler/frontend/sagemaker.py reads
    /opt/ml/model/model-config.yaml itself): weights from the model data only."""
    return {"HF_HUB_OFFLINE": "1"}


class DeployError(RuntimeError):
    """The deployment cannot go on; the message says why and where to look."""


def dlc_image_uri(region: str, tag: str | None = None, *, backend: str = "neuronx") -> str:
    """The region's DLC image: `tag`, or by default the DLC for `backend` (dlc_for)."""
    tag = tag or dlc_for(backend).tag
    account = DLC_ACCOUNTS.get(region)
    if account is None:
        raise ValueError(
            f"AWS documents no Deep Learning Containers registry for region '{region}'; "
            f"pass the image with --image-uri <account>.dkr.ecr.{region}.amazonaws.com/{DLC_REPOSITORY}:{tag}"
        )
    domain = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"{account}.dkr.ecr.{region}.{domain}/{DLC_REPOSITORY}:{tag}"


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
    network_isolation: bool = False  # the container gets no network at all (it needs none)
    subnets: tuple[str, ...] = ()  # VpcConfig: the endpoint's ENIs in your VPC (e.g. one without NAT)
    security_groups: tuple[str, ...] = ()

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
        if bool(self.subnets) != bool(self.security_groups):
            raise ValueError("a VPC configuration needs both --subnet and --security-group")

    @property
    def model_name(self) -> str:
        return self.endpoint_name

    @property
    def config_name(self) -> str:
        return self.endpoint_name


@dataclass(frozen=True)
class Probe:
    """How long --wait waits for a real answer after InService, and how often it asks."""

    timeout_s: float = 1800.0
    interval_s: float = 15.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    body: str = PROBE_BODY  # the request it sends: readiness_body(handler.task)


@dataclass
class Clients:
    sagemaker: Any
    runtime: Any = None  # sagemaker-runtime: the readiness probe (wait)
    autoscaling: Any = None  # application-autoscaling: only with Deployment.autoscaling
    s3: Any = None  # checks the model data before anything is created


def model_request(d: Deployment) -> dict[str, Any]:
    bucket, prefix = split_s3_uri(d.model_data)
    request: dict[str, Any] = {
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
    if d.network_isolation:
        request["EnableNetworkIsolation"] = True
    if d.subnets:
        request["VpcConfig"] = {"Subnets": list(d.subnets), "SecurityGroupIds": list(d.security_groups)}
    return request


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


def log_group(endpoint_name: str) -> str:
    return f"/aws/sagemaker/Endpoints/{endpoint_name}"


def check_model_data(s3, model_data: str) -> None:
    """The prefix must hold a folder from `make sagemaker-archive`: the container reads its sagemaker.properties."""
    bucket, prefix = split_s3_uri(model_data)
    for rel in ("MAR-INF/MANIFEST.json", PROPERTIES_NAME):
        try:
            s3.head_object(Bucket=bucket, Key=prefix + rel)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in {"403", "AccessDenied", "Forbidden"}:
                logger.warning("cannot read s3://%s/%s%s to check it (%s); going on", bucket, prefix, rel, code)
                return
            if code in {"404", "NoSuchKey", "NotFound"}:
                raise DeployError(
                    f"s3://{bucket}/{prefix}{rel} does not exist: upload the model folder with "
                    "`make sagemaker-upload MODEL_DIR=... SAGEMAKER_S3_URI=...` first"
                ) from None
            raise


def model_data_config(s3, model_data: str) -> dict[str, Any] | None:
    """The model-config.yaml in the uploaded model data; None when it cannot be read."""
    bucket, prefix = split_s3_uri(model_data)
    key = prefix + MODEL_CONFIG_NAME
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        raw = yaml.safe_load(body)
    except (ClientError, yaml.YAMLError) as exc:
        logger.warning("cannot read s3://%s/%s for the backend and task (%s)", bucket, key, exc)
        return None
    return raw if isinstance(raw, dict) else None


def model_data_backend(s3, model_data: str) -> str | None:
    """handler.backend of the model-config.yaml in the uploaded model data; None when it cannot be read."""
    raw = model_data_config(s3, model_data)
    return config_backend(raw) if raw is not None else None


def wait_in_service(sagemaker, endpoint_name: str) -> None:
    started = time.monotonic()
    try:
        sagemaker.get_waiter("endpoint_in_service").wait(
            EndpointName=endpoint_name, WaiterConfig={"Delay": 30, "MaxAttempts": 120}
        )
    except WaiterError as exc:
        reason = exc.last_response.get("FailureReason") or exc.last_response.get("EndpointStatus") or str(exc)
        raise DeployError(
            f"endpoint {endpoint_name} did not reach InService: {reason}; logs: CloudWatch {log_group(endpoint_name)}"
        ) from None
    logger.info("endpoint %s in service after %.0f s", endpoint_name, time.monotonic() - started)


def _invoke_once(runtime, endpoint_name: str, body: str) -> str:
    response = runtime.invoke_endpoint(
        EndpointName=endpoint_name, ContentType="application/json", Accept="application/json", Body=body
    )
    return response["Body"].read().decode("utf-8", "replace")


def _retryable(exc: Exception) -> str | None:
    """Why a failed probe may succeed later, or None when it will not."""
    if isinstance(exc, NETWORK_ERRORS):
        return f"{type(exc).__name__}: {exc}"
    if not isinstance(exc, ClientError):
        return None
    error = exc.response.get("Error", {})
    code = error.get("Code", "")
    status = exc.response.get("OriginalStatusCode")
    if code not in RETRYABLE_ERRORS or status in FATAL_CONTAINER_STATUSES:
        return None
    return f"{code}{f' ({status})' if status else ''}: {error.get('Message', '')}"


def wait_for_invocation(runtime, endpoint_name: str, probe: Probe) -> str:
    """POST the probe's request (1 token, or 1 embedding) until the endpoint answers 200; returns the answer."""
    deadline = probe.clock() + probe.timeout_s
    while True:
        try:
            answer = _invoke_once(runtime, endpoint_name, probe.body)
        except (ClientError, *NETWORK_ERRORS) as exc:
            why = _retryable(exc)
            if why is None:
                raise DeployError(
                    f"endpoint {endpoint_name} refused the readiness request: {exc}; "
                    f"logs: CloudWatch {log_group(endpoint_name)}"
                ) from None
            if probe.clock() + probe.interval_s > deadline:
                raise DeployError(
                    f"endpoint {endpoint_name} is InService but the model did not answer within "
                    f"{probe.timeout_s:.0f} s (last: {why}); logs: CloudWatch {log_group(endpoint_name)}"
                ) from None
            logger.info("model not answering yet (%s); retrying in %.0f s", why, probe.interval_s)
            probe.sleep(probe.interval_s)
        else:
            logger.info("endpoint %s answers: %s", endpoint_name, answer[:200])
            return answer


def deploy(clients: Clients, d: Deployment, wait: bool = False, probe: Probe | None = None) -> str:
    """Create model, endpoint config and endpoint (and autoscaling); returns the endpoint ARN.

    With wait, returns once the endpoint is InService and has answered a real request."""
    if clients.s3 is not None:
        check_model_data(clients.s3, d.model_data)
    sagemaker = clients.sagemaker
    sagemaker.create_model(**model_request(d))
    logger.info("model %s created (%s)", d.model_name, d.image_uri)
    sagemaker.create_endpoint_config(**endpoint_config_request(d))
    logger.info("endpoint config %s created", d.config_name)
    arn = sagemaker.create_endpoint(EndpointName=d.endpoint_name, EndpointConfigName=d.config_name)["EndpointArn"]
    logger.info("endpoint %s creating (%s)", d.endpoint_name, arn)
    if wait or d.autoscaling:  # a scalable target needs the variant to exist: wait for InService
        wait_in_service(sagemaker, d.endpoint_name)
    if d.autoscaling:
        enable_autoscaling(clients.autoscaling, d.endpoint_name, d.autoscaling)
    if wait:
        wait_for_invocation(clients.runtime, d.endpoint_name, probe or Probe())
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
    parser.add_argument(
        "--image-uri",
        default=None,
        help=f"default: the {DLC_REPOSITORY} DLC for the backend: "
        + ", ".join(f"{dlc.backend} {dlc.tag}" for dlc in DLCS.values()),
    )
    parser.add_argument(
        "--frontend",
        choices=FRONTENDS,
        default="torchserve",
        help="torchserve (the DLC) or asgi: your image from docker/Dockerfile.asgi, given with --image-uri",
    )
    parser.add_argument(
        "--backend",
        choices=sorted(DLCS),
        default=None,
        help="the backend the model data was built for, which picks the default image; default: handler.backend "
        f"of the uploaded {MODEL_CONFIG_NAME} (neuronx when it cannot be read)",
    )
    parser.add_argument("--instance-type", default="ml.inf2.xlarge")
    parser.add_argument("--instance-count", type=int, default=1)
    parser.add_argument("--volume-size", type=int, default=64, help="GB of EBS for the model data")
    parser.add_argument("--model-data-download-timeout", type=int, default=3600, help="seconds")
    parser.add_argument("--container-startup-health-check-timeout", type=int, default=600, help="seconds")
    parser.add_argument("--env", action="append", default=[], help="extra container KEY=VALUE (repeatable)")
    parser.add_argument("--autoscale-max", type=int, default=0, help="enable autoscaling up to this many instances")
    parser.add_argument("--autoscale-min", type=int, default=1)
    parser.add_argument("--autoscale-target", type=float, default=60.0, help="invocations per instance per minute")
    parser.add_argument(
        "--network-isolation", action="store_true", help="EnableNetworkIsolation: no network in the container"
    )
    parser.add_argument("--subnet", action="append", default=[], help="VpcConfig subnet id (repeatable)")
    parser.add_argument("--security-group", action="append", default=[], help="VpcConfig security group id")
    parser.add_argument("--wait", action="store_true", help="wait until InService and the model answers a request")
    parser.add_argument(
        "--task",
        choices=("generate", "embed"),
        help="handler.task of the archive, for --wait's request (default: read from the model data, else generate)",
    )
    parser.add_argument("--ready-timeout", type=float, default=1800.0, help="seconds to wait for that answer")
    parser.add_argument("--skip-model-data-check", action="store_true", help="do not look for the files in S3")
    return parser.parse_args(argv)


def deployment_from_args(args: argparse.Namespace, region: str, backend: str | None = None) -> Deployment:
    """`backend`: handler.backend as read from the model data, for the default image (--backend wins)."""
    scaling = Autoscaling(args.autoscale_min, args.autoscale_max, args.autoscale_target) if args.autoscale_max else None
    asgi = getattr(args, "frontend", "torchserve") == "asgi"
    if asgi and not args.image_uri:
        raise ValueError(
            "--frontend asgi needs --image-uri: your image built from docker/Dockerfile.asgi and pushed to ECR "
            "(docs/frontends.md); no public image carries it"
        )
    environment = asgi_environment() if asgi else container_environment()
    return Deployment(
        endpoint_name=args.endpoint_name or f"inf2-llm-{time.strftime('%Y%m%d-%H%M%S')}",
        model_data=args.model_data,
        role_arn=args.role_arn,
        image_uri=args.image_uri or dlc_image_uri(region, backend=args.backend or backend or "neuronx"),
        instance_type=args.instance_type,
        instance_count=args.instance_count,
        volume_size_gb=args.volume_size,
        model_data_download_timeout_s=args.model_data_download_timeout,
        startup_health_check_timeout_s=args.container_startup_health_check_timeout,
        environment={**environment, **_env_pairs(args.env)},
        autoscaling=scaling,
        network_isolation=args.network_isolation,
        subnets=tuple(args.subnet),
        security_groups=tuple(args.security_group),
    )


def clients_for(session, d: Deployment, args: argparse.Namespace) -> Clients:
    from botocore.config import Config

    # A request queued behind the model load is answered or cut by SageMaker at 60 s: read a little longer.
    runtime_config = Config(read_timeout=70, connect_timeout=10)
    return Clients(
        sagemaker=session.client("sagemaker"),
        runtime=session.client("sagemaker-runtime", config=runtime_config) if args.wait else None,
        autoscaling=session.client("application-autoscaling") if d.autoscaling else None,
        s3=None if args.skip_model_data_check else session.client("s3"),
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import boto3

    session = boto3.session.Session(region_name=args.region)
    try:
        if not session.region_name:
            raise DeployError("no AWS region: pass --region (AWS_REGION=... with make), or set one with aws configure")
        backend, task = None, args.task
        if not args.skip_model_data_check:
            raw = model_data_config(session.client("s3"), args.model_data)
            task = task or (config_task(raw) if raw is not None else None)
            if raw is not None and not (args.image_uri or args.backend):
                backend = config_backend(raw)
                logger.info("model data: handler.backend %s: the %s DLC", backend, dlc_for(backend).tag)
        d = deployment_from_args(args, session.region_name, backend)
        probe = Probe(timeout_s=args.ready_timeout, body=json.dumps(readiness_body(task or "generate")))
        deploy(clients_for(session, d, args), d, wait=args.wait, probe=probe)
    except (ValueError, DeployError) as exc:
        raise SystemExit(f"error: {exc}") from None
    print(d.endpoint_name)


if __name__ == "__main__":
    main()
