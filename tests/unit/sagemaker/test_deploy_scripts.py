"""The deployment scripts against moto's in-process AWS: the parameters each call
sends are recorded from botocore and checked, and moto's state is read back."""

from __future__ import annotations

import io
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber
from moto import mock_aws
from moto.sagemaker.models import FakeEndpointConfig

from scripts.sagemaker import deploy as sagemaker_deploy
from scripts.sagemaker import upload as sagemaker_upload
from scripts.sagemaker.common import split_s3_uri
from scripts.sagemaker.delete import delete
from scripts.sagemaker.deploy import Autoscaling, Clients, Deployment, Probe, deploy

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


SAGEMAKER_CONFIG = (
    "responseTimeout: 1200\nstartupTimeout: 1200\n"
    "handler:\n  model_checkpoint_dir: model\n  backend: neuronx\n  neuronx:\n    compile_on_start: false\n"
)


@pytest.fixture
def model_folder(tmp_path: Path) -> Path:
    """What `make sagemaker-archive` writes: manifest, handler, config, weights, artifacts, deps, properties."""
    root = tmp_path / "llama"
    for rel, content in {
        "MAR-INF/MANIFEST.json": '{"model": {"modelName": "llama"}}',
        "inf2_handler.py": "# handler",
        "handler/serving/service.py": "# service",
        "handler/__pycache__/service.cpython-311.pyc": "skip me",
        "model-config.yaml": SAGEMAKER_CONFIG,
        "model/model.safetensors": "weights",
        "model/neuron_cache/artifacts/manifest.json": "{}",
        "model/neuron_cache/artifacts/graph.neff": "compiled",
        "deps/cp310/pydantic-2.14.4.dist-info/METADATA": "Name: pydantic",
        "deps/cp310/pydantic/__init__.py": "",
        "sagemaker.properties": "allowed_urls=file:///opt/ml/model/.*\n",
    }.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return root


def make_bucket(s3: Any) -> None:
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})


def test_upload_sends_every_file_under_the_prefix(aws, recorder, model_folder, caplog):
    s3 = recorder.attach(boto3.client("s3", region_name=REGION))
    make_bucket(s3)
    uri = sagemaker_upload.upload(s3, model_folder, f"s3://{BUCKET}/llama-inf2")
    assert uri == f"s3://{BUCKET}/llama-inf2/"
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"])
    assert keys == [
        "llama-inf2/MAR-INF/MANIFEST.json",
        "llama-inf2/deps/cp310/pydantic-2.14.4.dist-info/METADATA",
        "llama-inf2/deps/cp310/pydantic/__init__.py",
        "llama-inf2/handler/serving/service.py",
        "llama-inf2/inf2_handler.py",
        "llama-inf2/model-config.yaml",
        "llama-inf2/model/model.safetensors",
        "llama-inf2/model/neuron_cache/artifacts/graph.neff",
        "llama-inf2/model/neuron_cache/artifacts/manifest.json",
        "llama-inf2/sagemaker.properties",
    ]
    neff = s3.get_object(Bucket=BUCKET, Key="llama-inf2/model/neuron_cache/artifacts/graph.neff")["Body"].read()
    assert neff == b"compiled"
    assert {p["Key"] for p in recorder.params("PutObject")} == set(keys)
    assert "warning" not in caplog.text  # a load-safe responseTimeout above 60 s is right for the DLC


def test_upload_refuses_a_folder_that_is_not_a_torchserve_model(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match=r"MAR-INF/MANIFEST\.json"):
        sagemaker_upload.model_files(tmp_path)


@pytest.mark.parametrize(
    ("remove", "message"),
    [
        ("sagemaker.properties", "no sagemaker.properties"),
        ("deps/cp310", "no deps/cp310/ with pydantic"),
        ("model/neuron_cache", "no compiled Neuron artifacts"),
    ],
)
def test_upload_refuses_a_folder_the_endpoint_could_not_start_before_sending_anything(
    aws, recorder, model_folder, remove, message
):
    shutil.rmtree(model_folder / remove) if (model_folder / remove).is_dir() else (model_folder / remove).unlink()
    s3 = recorder.attach(boto3.client("s3", region_name=REGION))
    make_bucket(s3)
    with pytest.raises(SystemExit, match=re.escape(message)):
        sagemaker_upload.upload(s3, model_folder, f"s3://{BUCKET}/llama-inf2/")
    assert recorder.params("PutObject") == []


NXDI_SAGEMAKER_CONFIG = SAGEMAKER_CONFIG.replace("backend: neuronx", "backend: nxdi").replace("neuronx:", "nxdi:")


def as_nxdi(folder: Path, deps: str | None = "cp312") -> Path:
    """The model folder as built from an nxdi config: deps for the nxdi DLC's Python 3.12."""
    (folder / "model-config.yaml").write_text(NXDI_SAGEMAKER_CONFIG)
    shutil.rmtree(folder / "deps")
    if deps:
        (folder / "deps" / deps / "pydantic-2.14.4.dist-info").mkdir(parents=True)
    return folder


def test_upload_accepts_an_nxdi_folder_with_deps_for_python_3_12(model_folder):
    found = sagemaker_upload.check_model_folder(as_nxdi(model_folder))
    assert (found.errors, found.warnings) == ([], [])


def test_upload_refuses_an_nxdi_folder_without_deps(model_folder):
    (error,) = sagemaker_upload.check_model_folder(as_nxdi(model_folder, deps=None)).errors
    assert "no deps/cp312/ with pydantic" in error


@pytest.mark.parametrize(("backend", "deps", "image_python"), [("nxdi", "cp310", "3.12"), ("neuronx", "cp312", "3.10")])
def test_deps_for_another_python_than_the_backends_image_only_warn(model_folder, backend, deps, image_python):
    """--python-version for an --image-uri with another Python: the upload goes on, saying so."""
    if backend == "nxdi":
        as_nxdi(model_folder, deps=deps)
    else:
        shutil.rmtree(model_folder / "deps")
        (model_folder / "deps" / deps / "pydantic-2.14.4.dist-info").mkdir(parents=True)
    found = sagemaker_upload.check_model_folder(model_folder)
    (warning,) = found.warnings
    assert found.errors == []
    assert f"for {deps}, not for deps/cp{image_python.replace('.', '')}" in warning and "--image-uri" in warning
    assert f"runs Python {image_python}" in warning


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
    arn = deploy(Clients(sm), deployment())
    assert arn.endswith(":endpoint/llama-inf2-test")
    assert recorder.operations() == ["CreateModel", "CreateEndpointConfig", "CreateEndpoint"]

    (model,) = recorder.params("CreateModel")
    assert model["ModelName"] == "llama-inf2-test" and model["ExecutionRoleArn"] == ROLE
    container = model["PrimaryContainer"]
    assert container["Image"] == (
        f"763104351884.dkr.ecr.{REGION}.amazonaws.com/pytorch-inference-neuronx:"
        "2.7.0-neuronx-py310-sdk2.25.0-ubuntu22.04"
    )
    assert container["ModelDataSource"] == {
        "S3DataSource": {"S3Uri": f"s3://{BUCKET}/llama-inf2/", "S3DataType": "S3Prefix", "CompressionType": "None"}
    }
    assert "ModelDataUrl" not in container  # uncompressed data goes through ModelDataSource only
    # torchserve reads the archive's sagemaker.properties instead of the toolkit's file
    assert container["Environment"] == {
        "TS_CONFIG_FILE": "/opt/ml/model/sagemaker.properties",
        "HF_HUB_OFFLINE": "1",
        "INF2_STATE_DIR": "/tmp/inf2-state",  # writable: /opt/ml/model is read-only
    }

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


def test_an_endpoint_without_internet_access(aws, recorder):
    """Network isolation and a VPC without NAT: nothing in the container needs the network."""
    args = sagemaker_deploy.parse_args(
        ["--model-data", f"s3://{BUCKET}/llama-inf2/", "--role-arn", ROLE, "--endpoint-name", "llama-inf2-test"]
        + ["--network-isolation", "--subnet", "subnet-0a", "--subnet", "subnet-0b", "--security-group", "sg-01"]
    )
    sm = recorder.attach(boto3.client("sagemaker", region_name=REGION))
    deploy(Clients(sm), sagemaker_deploy.deployment_from_args(args, REGION))
    (model,) = recorder.params("CreateModel")
    assert model["EnableNetworkIsolation"] is True
    assert model["VpcConfig"] == {"Subnets": ["subnet-0a", "subnet-0b"], "SecurityGroupIds": ["sg-01"]}


def test_a_default_endpoint_leaves_network_settings_to_sagemaker(aws, recorder):
    sm = recorder.attach(boto3.client("sagemaker", region_name=REGION))
    deploy(Clients(sm), deployment())
    (model,) = recorder.params("CreateModel")
    assert "EnableNetworkIsolation" not in model and "VpcConfig" not in model


def test_deploy_with_autoscaling_then_delete_everything(aws, recorder):
    sm = recorder.attach(boto3.client("sagemaker", region_name=REGION))
    scaling = recorder.attach(boto3.client("application-autoscaling", region_name=REGION))
    deploy(Clients(sm, autoscaling=scaling), deployment(autoscaling=Autoscaling(2, 6, 80.0)))

    # the real waiter: moto's endpoints are InService at once
    assert recorder.operations()[-4:] == [
        "CreateEndpoint",
        "DescribeEndpoint",
        "RegisterScalableTarget",
        "PutScalingPolicy",
    ]
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
        ({"subnets": ("subnet-0a",)}, "needs both --subnet and --security-group"),
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
    assert d.environment["EXTRA"] == "1" and d.environment["TS_CONFIG_FILE"] == "/opt/ml/model/sagemaker.properties"


@pytest.mark.parametrize(
    ("region", "registry"),
    [
        ("us-west-2", "763104351884.dkr.ecr.us-west-2.amazonaws.com"),
        ("ap-east-2", "975050140332.dkr.ecr.ap-east-2.amazonaws.com"),
        ("eu-south-2", "503227376785.dkr.ecr.eu-south-2.amazonaws.com"),
        ("cn-north-1", "727897471807.dkr.ecr.cn-north-1.amazonaws.com.cn"),
    ],
)
def test_default_image_is_the_sdk_2_25_dlc_from_the_regions_registry(region, registry):
    assert sagemaker_deploy.dlc_image_uri(region) == (
        f"{registry}/pytorch-inference-neuronx:2.7.0-neuronx-py310-sdk2.25.0-ubuntu22.04"
    )


def test_a_region_without_a_documented_registry_asks_for_image_uri():
    args = sagemaker_deploy.parse_args(["--model-data", "s3://bkt/p", "--role-arn", ROLE])
    with pytest.raises(
        ValueError, match=r"no Deep Learning Containers registry for region 'xx-nowhere-1'.*--image-uri"
    ):
        sagemaker_deploy.deployment_from_args(args, "xx-nowhere-1")
    args = sagemaker_deploy.parse_args(["--model-data", "s3://bkt/p", "--role-arn", ROLE, "--image-uri", "my/image:1"])
    assert sagemaker_deploy.deployment_from_args(args, "xx-nowhere-1").image_uri == "my/image:1"


def test_the_asgi_frontend_needs_the_users_image_and_no_torchserve_environment(aws, recorder):
    base = ["--model-data", f"s3://{BUCKET}/minilm/", "--role-arn", ROLE, "--frontend", "asgi"]
    with pytest.raises(ValueError, match=r"--frontend asgi needs --image-uri.*docker/Dockerfile.asgi"):
        sagemaker_deploy.deployment_from_args(sagemaker_deploy.parse_args(base), REGION)
    image = f"111122223333.dkr.ecr.{REGION}.amazonaws.com/inf2-llm-asgi:1"
    args = sagemaker_deploy.parse_args([*base, "--image-uri", image, "--endpoint-name", "asgi-1", "--env", "X=1"])
    d = sagemaker_deploy.deployment_from_args(args, REGION)
    sm = recorder.attach(boto3.client("sagemaker", region_name=REGION))
    deploy(Clients(sm), d)
    (model,) = recorder.params("CreateModel")
    assert model["PrimaryContainer"]["Image"] == image
    assert model["PrimaryContainer"]["Environment"] == {"HF_HUB_OFFLINE": "1", "X": "1"}  # no TS_CONFIG_FILE
    assert sm.describe_model(ModelName="asgi-1")["PrimaryContainer"]["Image"] == image
    # the default stays TorchServe's DLC
    default = sagemaker_deploy.parse_args(["--model-data", f"s3://{BUCKET}/m/", "--role-arn", ROLE])
    assert default.frontend == "torchserve"
    assert "TS_CONFIG_FILE" in sagemaker_deploy.deployment_from_args(default, REGION).environment


NXDI_TAG = "2.9.0-neuronx-py312-sdk2.28.0-ubuntu24.04"


@pytest.mark.parametrize(
    ("region", "registry"),
    [
        ("us-west-2", "763104351884.dkr.ecr.us-west-2.amazonaws.com"),
        ("ap-east-2", "975050140332.dkr.ecr.ap-east-2.amazonaws.com"),
        ("cn-north-1", "727897471807.dkr.ecr.cn-north-1.amazonaws.com.cn"),
    ],
)
def test_the_nxdi_image_is_the_sdk_2_28_dlc_from_the_regions_registry(region, registry):
    assert sagemaker_deploy.dlc_image_uri(region, backend="nxdi") == f"{registry}/pytorch-inference-neuronx:{NXDI_TAG}"


@pytest.mark.parametrize(
    ("from_model_data", "flags", "tag"),
    [
        (None, [], "2.7.0-neuronx-py310-sdk2.25.0-ubuntu22.04"),  # unknown: neuronx, as before
        ("neuronx", [], "2.7.0-neuronx-py310-sdk2.25.0-ubuntu22.04"),
        ("auto", [], "2.7.0-neuronx-py310-sdk2.25.0-ubuntu22.04"),
        ("hf", [], "2.7.0-neuronx-py310-sdk2.25.0-ubuntu22.04"),
        ("nxdi", [], NXDI_TAG),
        (None, ["--backend", "nxdi"], NXDI_TAG),
        ("nxdi", ["--backend", "neuronx"], "2.7.0-neuronx-py310-sdk2.25.0-ubuntu22.04"),  # --backend wins
    ],
)
def test_the_default_image_follows_the_backend(from_model_data, flags, tag):
    args = sagemaker_deploy.parse_args(["--model-data", "s3://bkt/p", "--role-arn", ROLE, *flags])
    d = sagemaker_deploy.deployment_from_args(args, REGION, from_model_data)
    assert d.image_uri == f"763104351884.dkr.ecr.{REGION}.amazonaws.com/pytorch-inference-neuronx:{tag}"


def test_image_uri_overrides_the_backends_image():
    args = sagemaker_deploy.parse_args(
        ["--model-data", "s3://bkt/p", "--role-arn", ROLE, "--backend", "nxdi", "--image-uri", "my/image:1"]
    )
    assert sagemaker_deploy.deployment_from_args(args, REGION, "nxdi").image_uri == "my/image:1"


def put_archive(s3: Any, config: str | None) -> None:
    """What sagemaker_upload leaves under the prefix, as far as the deploy reads it."""
    make_bucket(s3)
    for rel in ("MAR-INF/MANIFEST.json", "sagemaker.properties"):
        s3.put_object(Bucket=BUCKET, Key=f"llama-inf2/{rel}", Body=b"x")
    if config is not None:
        s3.put_object(Bucket=BUCKET, Key="llama-inf2/model-config.yaml", Body=config.encode())


@pytest.mark.parametrize(
    ("config", "backend"),
    [
        (SAGEMAKER_CONFIG.replace("backend: neuronx", "backend: nxdi").replace("neuronx:", "nxdi:"), "nxdi"),
        (SAGEMAKER_CONFIG, "neuronx"),
        ("handler:\n  model_checkpoint_dir: model\n", "hf"),
        (None, None),  # no model-config.yaml
        ("handler: [unclosed", None),  # not YAML
        ("- a list", None),
    ],
)
def test_the_backend_is_read_from_the_uploaded_model_config(aws, config, backend):
    s3 = boto3.client("s3", region_name=REGION)
    put_archive(s3, config)
    assert sagemaker_deploy.model_data_backend(s3, f"s3://{BUCKET}/llama-inf2/") == backend


@pytest.mark.parametrize(
    ("backend", "flags", "tag"),
    [
        ("nxdi", [], NXDI_TAG),
        ("neuronx", [], "2.7.0-neuronx-py310-sdk2.25.0-ubuntu22.04"),
        ("nxdi", ["--skip-model-data-check"], "2.7.0-neuronx-py310-sdk2.25.0-ubuntu22.04"),  # nothing read
        ("nxdi", ["--image-uri", "my/image:1"], None),
    ],
)
def test_the_deploy_command_picks_the_image_of_the_uploaded_configs_backend(aws, capsys, backend, flags, tag):
    s3 = boto3.client("s3", region_name=REGION)
    config = SAGEMAKER_CONFIG.replace("backend: neuronx", f"backend: {backend}").replace("neuronx:", f"{backend}:")
    put_archive(s3, config)
    sagemaker_deploy.main(
        ["--model-data", f"s3://{BUCKET}/llama-inf2/", "--role-arn", ROLE, "--endpoint-name", "ep-1"]
        + ["--region", REGION, *flags]
    )
    assert capsys.readouterr().out.strip() == "ep-1"
    image = boto3.client("sagemaker", region_name=REGION).describe_model(ModelName="ep-1")["PrimaryContainer"]["Image"]
    expected = f"763104351884.dkr.ecr.{REGION}.amazonaws.com/pytorch-inference-neuronx:{tag}" if tag else flags[-1]
    assert image == expected


class FakeTime:
    """The probe's clock and sleep: sleeping advances the clock; nothing really waits."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def probe(self, timeout_s: float = 1800.0) -> Probe:
        return Probe(timeout_s=timeout_s, interval_s=15.0, clock=self.clock, sleep=self.sleep)


PROBE_PARAMS = {
    "EndpointName": "llama-inf2-test",
    "ContentType": "application/json",
    "Accept": "application/json",
    "Body": '{"prompt": "ping", "max_new_tokens": 1, "stream": false}',
}


def stubbed_runtime() -> tuple[Any, Stubber]:
    """A real sagemaker-runtime client; Stubber checks each call's parameters against the API and ours."""
    runtime = boto3.client("sagemaker-runtime", region_name=REGION)
    return runtime, Stubber(runtime)


def model_error(stubber: Stubber, original_status: int, original_message: str) -> None:
    stubber.add_client_error(
        "invoke_endpoint",
        service_error_code="ModelError",
        service_message=f"Received server error ({original_status}) from primary with message {original_message}",
        http_status_code=424,
        modeled_fields={"OriginalStatusCode": original_status, "OriginalMessage": original_message},
        expected_params=PROBE_PARAMS,
    )


def answer(stubber: Stubber, text: str) -> None:
    body = json.dumps({"text": text, "finish_reason": "length"}).encode()
    stubber.add_response(
        "invoke_endpoint",
        {"Body": StreamingBody(io.BytesIO(body), len(body)), "ContentType": "application/json"},
        expected_params=PROBE_PARAMS,
    )


def test_wait_means_in_service_and_then_a_real_answer(aws, recorder):
    """TorchServe 0.11's /ping says Healthy before the model loaded: InService is not enough."""
    sm = recorder.attach(boto3.client("sagemaker", region_name=REGION))
    runtime, stubber = stubbed_runtime()
    model_error(stubber, 503, "Model model has no worker to serve inference request")
    model_error(stubber, 0, "Your invocation timed out while waiting for a response from container primary")
    answer(stubber, " sunny")
    fake = FakeTime()
    with stubber:
        deploy(Clients(sm, runtime=runtime), deployment(), wait=True, probe=fake.probe())
        stubber.assert_no_pending_responses()
    assert recorder.operations() == ["CreateModel", "CreateEndpointConfig", "CreateEndpoint", "DescribeEndpoint"]
    assert fake.sleeps == [15.0, 15.0]


def test_wait_gives_up_when_the_model_never_answers(aws):
    sm = boto3.client("sagemaker", region_name=REGION)
    runtime, stubber = stubbed_runtime()
    for _ in range(3):  # at 0, 15 and 30 s; the next try would come after the 40 s timeout
        model_error(stubber, 503, "Model model has no worker to serve inference request")
    fake = FakeTime()
    with stubber, pytest.raises(sagemaker_deploy.DeployError) as failed:
        deploy(Clients(sm, runtime=runtime), deployment(), wait=True, probe=fake.probe(timeout_s=40))
    stubber.assert_no_pending_responses()
    message = str(failed.value)
    assert "did not answer within 40 s" in message and "ModelError (503)" in message
    assert "/aws/sagemaker/Endpoints/llama-inf2-test" in message


def test_wait_stops_at_once_when_the_container_refuses_the_request(aws):
    sm = boto3.client("sagemaker", region_name=REGION)
    runtime, stubber = stubbed_runtime()
    model_error(stubber, 400, "InvalidKeyException: Token Authorization failed")  # token auth left on
    fake = FakeTime()
    with stubber, pytest.raises(sagemaker_deploy.DeployError, match="refused the readiness request"):
        deploy(Clients(sm, runtime=runtime), deployment(), wait=True, probe=fake.probe())
    assert fake.sleeps == []


def test_an_endpoint_that_fails_to_start_says_why():
    sm = boto3.client("sagemaker", region_name=REGION)
    stubber = Stubber(sm)
    stubber.add_response(
        "describe_endpoint",
        {
            "EndpointName": "llama-inf2-test",
            "EndpointArn": "arn:aws:sagemaker:us-west-2:123456789012:endpoint/llama-inf2-test",
            "EndpointConfigName": "llama-inf2-test",
            "EndpointStatus": "Failed",
            "FailureReason": "The primary container for variant AllTraffic did not pass the ping health check",
            "CreationTime": "2026-11-30T12:00:00Z",
            "LastModifiedTime": "2026-11-30T12:30:00Z",
        },
        {"EndpointName": "llama-inf2-test"},
    )
    with stubber, pytest.raises(sagemaker_deploy.DeployError, match="did not pass the ping health check"):
        sagemaker_deploy.wait_in_service(sm, "llama-inf2-test")


@pytest.mark.parametrize("uploaded", [[], ["MAR-INF/MANIFEST.json"]])
def test_deploy_refuses_model_data_that_is_not_a_sagemaker_archive(aws, recorder, uploaded):
    s3 = boto3.client("s3", region_name=REGION)
    make_bucket(s3)
    for rel in uploaded:
        s3.put_object(Bucket=BUCKET, Key=f"llama-inf2/{rel}", Body=b"{}")
    sm = recorder.attach(boto3.client("sagemaker", region_name=REGION))
    with pytest.raises(sagemaker_deploy.DeployError, match="does not exist: upload the model folder"):
        deploy(Clients(sm, s3=s3), deployment())
    assert recorder.operations() == []  # nothing created


def test_deploy_goes_on_when_the_model_data_is_there(aws, recorder):
    s3 = boto3.client("s3", region_name=REGION)
    make_bucket(s3)
    for rel in ("MAR-INF/MANIFEST.json", "sagemaker.properties"):
        s3.put_object(Bucket=BUCKET, Key=f"llama-inf2/{rel}", Body=b"x")
    sm = recorder.attach(boto3.client("sagemaker", region_name=REGION))
    deploy(Clients(sm, s3=s3), deployment())
    assert recorder.operations() == ["CreateModel", "CreateEndpointConfig", "CreateEndpoint"]


@pytest.mark.parametrize(
    ("uri", "expected"),
    [("s3://b-1/a/b", ("b-1", "a/b/")), ("s3://bucket", ("bucket", "")), ("s3://bucket/x/", ("bucket", "x/"))],
)
def test_split_s3_uri(uri, expected):
    assert split_s3_uri(uri) == expected


@pytest.mark.parametrize(
    ("config", "flags", "body"),
    [
        ("handler:\n  task: embed\n", [], {"inputs": "ping"}),  # an embedding archive: one embedded word
        ("handler:\n  task: generate\n", [], {"prompt": "ping", "max_new_tokens": 1, "stream": False}),
        (None, [], {"prompt": "ping", "max_new_tokens": 1, "stream": False}),  # unreadable: the LLM's default
        (None, ["--task", "embed"], {"inputs": "ping"}),
        ("handler:\n  task: embed\n", ["--backend", "neuronx"], {"inputs": "ping"}),  # the image chosen, task read
    ],
)
def test_the_readiness_request_follows_the_uploaded_configs_task(aws, monkeypatch, config, flags, body):
    """An embedding archive refuses generation fields with a 400, which --wait takes as final: its probe
    must ask for an embedding."""
    s3 = boto3.client("s3", region_name=REGION)
    put_archive(s3, config)
    probes: list[Probe] = []
    monkeypatch.setattr(sagemaker_deploy, "deploy", lambda clients, d, wait, probe: probes.append(probe))
    sagemaker_deploy.main(
        ["--model-data", f"s3://{BUCKET}/llama-inf2/", "--role-arn", ROLE, "--endpoint-name", "ep-1", "--wait"]
        + ["--region", REGION, *flags]
    )
    assert [json.loads(probe.body) for probe in probes] == [body]


def test_wait_sends_the_probes_own_request(aws):
    runtime, stubber = stubbed_runtime()
    body = json.dumps({"inputs": "ping"})
    payload = json.dumps([[0.1, 0.2]]).encode()
    stubber.add_response(
        "invoke_endpoint",
        {"Body": StreamingBody(io.BytesIO(payload), len(payload)), "ContentType": "application/json"},
        expected_params={**PROBE_PARAMS, "Body": body},
    )
    fake = FakeTime()
    probe = Probe(timeout_s=60, interval_s=15.0, clock=fake.clock, sleep=fake.sleep, body=body)
    with stubber:
        assert sagemaker_deploy.wait_for_invocation(runtime, "llama-inf2-test", probe) == "[[0.1, 0.2]]"
        stubber.assert_no_pending_responses()
