"""The deployment scripts against moto's in-process AWS: the parameters each call
sends are recorded from botocore and checked, and moto's state is read back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws
from moto.sagemaker.models import FakeEndpointConfig

from scripts import sagemaker_deploy, sagemaker_upload
from scripts.sagemaker_common import container_environment, read_properties, split_s3_uri
from scripts.sagemaker_delete import delete
from scripts.sagemaker_deploy import Autoscaling, Deployment, deploy

REGION = "us-west-2"
ROLE = "arn:aws:iam::123456789012:role/SageMakerExecution"
BUCKET = "inf2-models"
INF2_INSTANCE_TYPES = {"ml.inf2.xlarge", "ml.inf2.8xlarge", "ml.inf2.24xlarge", "ml.inf2.48xlarge"}


class Recorder:
    """Every API call's parameters, as botocore is about to serialize them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.calls.append((model.name, json.loads(json.dumps(params, default=str))))

    def attach(self, client: Any) -> Any:
        client.meta.events.register("provide-client-params.*.*", self)
        return client

    def params(self, operation: str) -> list[dict[str, Any]]:
        return [p for name, p in self.calls if name == operation]

    def operations(self) -> list[str]:
        return [name for name, _ in self.calls]


@pytest.fixture
def aws(monkeypatch) -> Iterator[None]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    # moto 5.2's instance type enum predates Inferentia2; the real API takes these four.
    moto_check = FakeEndpointConfig.validate_instance_type

    def validate_instance_type(self: FakeEndpointConfig, instance_type: str) -> None:
        if instance_type not in INF2_INSTANCE_TYPES:
            moto_check(self, instance_type)

    monkeypatch.setattr(FakeEndpointConfig, "validate_instance_type", validate_instance_type)
    with mock_aws():
        yield


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def model_folder(tmp_path: Path) -> Path:
    """What `make archive` writes (no-archive): manifest, handler, config, weights, compiled artifacts."""
    root = tmp_path / "llama"
    for rel, content in {
        "MAR-INF/MANIFEST.json": '{"model": {"modelName": "llama"}}',
        "inf2_handler.py": "# handler",
        "handler/service.py": "# service",
        "handler/__pycache__/service.cpython-311.pyc": "skip me",
        "model-config.yaml": "responseTimeout: 120\nhandler:\n  model_checkpoint_dir: model\n",
        "model/model.safetensors": "weights",
        "model/neuron_artifacts/graph.neff": "compiled",
        "requirements.txt": "pydantic>=2.5,<3\n",
    }.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return root


def test_upload_sends_every_file_under_the_prefix(aws, recorder, model_folder, caplog):
    s3 = recorder.attach(boto3.client("s3", region_name=REGION))
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
    uri = sagemaker_upload.upload(s3, model_folder, f"s3://{BUCKET}/llama-inf2")
    assert uri == f"s3://{BUCKET}/llama-inf2/"
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"])
    assert keys == [
        "llama-inf2/MAR-INF/MANIFEST.json",
        "llama-inf2/handler/service.py",
        "llama-inf2/inf2_handler.py",
        "llama-inf2/model-config.yaml",
        "llama-inf2/model/model.safetensors",
        "llama-inf2/model/neuron_artifacts/graph.neff",
        "llama-inf2/requirements.txt",
    ]
    neff = s3.get_object(Bucket=BUCKET, Key="llama-inf2/model/neuron_artifacts/graph.neff")["Body"].read()
    assert neff == b"compiled"
    assert {p["Key"] for p in recorder.params("PutObject")} == set(keys)
    assert "responseTimeout=120s is above SageMaker's 60s" in caplog.text


def test_upload_refuses_a_folder_that_is_not_a_torchserve_model(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match=r"MAR-INF/MANIFEST\.json"):
        sagemaker_upload.model_files(tmp_path)


def deployment(**overrides: Any) -> Deployment:
    values: dict[str, Any] = {
        "endpoint_name": "llama-inf2-test",
        "model_data": f"s3://{BUCKET}/llama-inf2/",
        "role_arn": ROLE,
        "image_uri": sagemaker_deploy.dlc_image_uri(REGION),
        "instance_type": "ml.inf2.24xlarge",
        "instance_count": 2,
        "volume_size_gb": 512,
        "model_data_download_timeout_s": 3600,
        "startup_health_check_timeout_s": 600,
        **overrides,
    }
    return Deployment(**values)


def test_deploy_sends_the_seed_knobs(aws, recorder):
    sm = recorder.attach(boto3.client("sagemaker", region_name=REGION))
    arn = deploy(sm, deployment())
    assert arn.endswith(":endpoint/llama-inf2-test")
    assert recorder.operations() == ["CreateModel", "CreateEndpointConfig", "CreateEndpoint"]

    (model,) = recorder.params("CreateModel")
    assert model["ModelName"] == "llama-inf2-test" and model["ExecutionRoleArn"] == ROLE
    container = model["PrimaryContainer"]
    assert container["Image"] == (
        f"763104351884.dkr.ecr.{REGION}.amazonaws.com/pytorch-inference-neuronx:{sagemaker_deploy.DEFAULT_DLC_TAG}"
    )
    assert container["ModelDataSource"] == {
        "S3DataSource": {"S3Uri": f"s3://{BUCKET}/llama-inf2/", "S3DataType": "S3Prefix", "CompressionType": "None"}
    }
    assert "ModelDataUrl" not in container  # uncompressed data goes through ModelDataSource only
    env = container["Environment"]
    assert env["TS_DISABLE_TOKEN_AUTHORIZATION"] == "true"
    assert env["TS_ENABLE_MODEL_API"] == "false"
    assert env["TS_INSTALL_PY_DEP_PER_MODEL"] == "true"
    assert int(env["TS_DEFAULT_RESPONSE_TIMEOUT"]) <= 60
    assert env["HF_HUB_OFFLINE"] == "1"

    (config,) = recorder.params("CreateEndpointConfig")
    assert config["EndpointConfigName"] == "llama-inf2-test"
    assert config["ProductionVariants"] == [
        {
            "VariantName": "AllTraffic",
            "ModelName": "llama-inf2-test",
            "InstanceType": "ml.inf2.24xlarge",
            "InitialInstanceCount": 2,
            "VolumeSizeInGB": 512,
            "ModelDataDownloadTimeoutInSeconds": 3600,
            "ContainerStartupHealthCheckTimeoutInSeconds": 600,
        }
    ]
    (endpoint,) = recorder.params("CreateEndpoint")
    assert endpoint == {"EndpointName": "llama-inf2-test", "EndpointConfigName": "llama-inf2-test"}

    # moto kept what was sent
    described = sm.describe_endpoint_config(EndpointConfigName="llama-inf2-test")["ProductionVariants"][0]
    assert (described["InstanceType"], described["InitialInstanceCount"]) == ("ml.inf2.24xlarge", 2)
    assert sm.describe_endpoint(EndpointName="llama-inf2-test")["EndpointConfigName"] == "llama-inf2-test"
    assert sm.describe_model(ModelName="llama-inf2-test")["ExecutionRoleArn"] == ROLE


def test_deploy_with_autoscaling_then_delete_everything(aws, recorder):
    sm = recorder.attach(boto3.client("sagemaker", region_name=REGION))
    scaling = recorder.attach(boto3.client("application-autoscaling", region_name=REGION))
    sm.get_waiter = lambda name: _NoWait(name, recorder)  # moto endpoints are InService at once
    deploy(sm, deployment(autoscaling=Autoscaling(2, 6, 80.0)), scaling)

    assert recorder.operations()[-3:] == ["wait:endpoint_in_service", "RegisterScalableTarget", "PutScalingPolicy"]
    (target,) = recorder.params("RegisterScalableTarget")
    assert target == {
        "ServiceNamespace": "sagemaker",
        "ResourceId": "endpoint/llama-inf2-test/variant/AllTraffic",
        "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
        "MinCapacity": 2,
        "MaxCapacity": 6,
    }
    (policy,) = recorder.params("PutScalingPolicy")
    assert policy["PolicyType"] == "TargetTrackingScaling"
    assert policy["TargetTrackingScalingPolicyConfiguration"] == {
        "TargetValue": 80.0,
        "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
        "ScaleInCooldown": 300,
        "ScaleOutCooldown": 60,
    }
    registered = scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert [(t["MinCapacity"], t["MaxCapacity"]) for t in registered] == [(2, 6)]

    deleted = delete(sm, "llama-inf2-test", scaling)
    assert deleted == [
        "scalable-target:endpoint/llama-inf2-test/variant/AllTraffic",
        "endpoint:llama-inf2-test",
        "endpoint-config:llama-inf2-test",
        "model:llama-inf2-test",
    ]
    assert recorder.params("DeleteEndpoint") == [{"EndpointName": "llama-inf2-test"}]
    assert recorder.params("DeleteEndpointConfig") == [{"EndpointConfigName": "llama-inf2-test"}]
    assert recorder.params("DeleteModel") == [{"ModelName": "llama-inf2-test"}]
    assert sm.list_endpoints()["Endpoints"] == [] and sm.list_models()["Models"] == []
    assert scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
    assert delete(sm, "llama-inf2-test", scaling) == []  # a second run finds nothing and says so


def test_delete_cleans_a_half_finished_deploy(aws):
    sm = boto3.client("sagemaker", region_name=REGION)
    sm.create_model(**sagemaker_deploy.model_request(deployment()))  # the config and endpoint never got made
    assert delete(sm, "llama-inf2-test") == ["model:llama-inf2-test"]


class _NoWait:
    def __init__(self, name: str, recorder: Recorder) -> None:
        self.name, self.recorder = name, recorder

    def wait(self, **params: Any) -> None:
        assert params["EndpointName"] == "llama-inf2-test"
        self.recorder.calls.append((f"wait:{self.name}", params))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"instance_type": "ml.g5.xlarge"}, "not an Inferentia2 instance"),
        ({"volume_size_gb": 1024}, "volume size"),
        ({"model_data_download_timeout_s": 7200}, "model data download timeout"),
        ({"startup_health_check_timeout_s": 30}, "startup health check timeout"),
        ({"endpoint_name": "bad_name"}, "endpoint name"),
        ({"model_data": "https://bucket/x"}, "s3://"),
        ({"instance_count": 0}, "instance count"),
        ({"autoscaling": Autoscaling(3, 4, 10.0)}, "above the initial instance count"),
    ],
)
def test_bad_deployments_fail_before_any_call(overrides, message):
    with pytest.raises(ValueError, match=message):
        deployment(**overrides)


def test_cli_arguments_become_the_deployment():
    args = sagemaker_deploy.parse_args(
        [
            "--model-data",
            "s3://bkt/p",
            "--role-arn",
            ROLE,
            "--endpoint-name",
            "ep-1",
            "--instance-type",
            "ml.inf2.48xlarge",
        ]
        + ["--volume-size", "256", "--env", "EXTRA=1", "--autoscale-max", "3", "--autoscale-target", "30"]
    )
    d = sagemaker_deploy.deployment_from_args(args, "eu-west-1")
    assert d.image_uri.startswith("763104351884.dkr.ecr.eu-west-1.amazonaws.com/pytorch-inference-neuronx:")
    assert (d.instance_type, d.volume_size_gb, d.autoscaling) == ("ml.inf2.48xlarge", 256, Autoscaling(1, 3, 30.0))
    assert d.environment["EXTRA"] == "1" and d.environment["TS_ENABLE_MODEL_API"] == "false"


def test_container_environment_leaves_ports_and_model_loading_to_the_toolkit():
    env = container_environment()
    assert set(env) == {
        "TS_DISABLE_TOKEN_AUTHORIZATION",
        "TS_ENABLE_MODEL_API",
        "TS_DEFAULT_RESPONSE_TIMEOUT",
        "TS_DECODE_INPUT_REQUEST",
        "TS_INSTALL_PY_DEP_PER_MODEL",
        "HF_HUB_OFFLINE",
    }
    props = {p.key: p.value for p in read_properties()}
    assert props["inference_address"] == "http://0.0.0.0:8080"
    assert props["disable_token_authorization"] == "true" and props["enable_model_api"] == "false"
    assert int(props["default_response_timeout"]) < 60


@pytest.mark.parametrize(
    ("uri", "expected"),
    [("s3://b-1/a/b", ("b-1", "a/b/")), ("s3://bucket", ("bucket", "")), ("s3://bucket/x/", ("bucket", "x/"))],
)
def test_split_s3_uri(uri, expected):
    assert split_s3_uri(uri) == expected
