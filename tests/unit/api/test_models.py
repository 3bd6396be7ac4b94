"""The pydantic models accept the samples and refuse every invalid case, naming the field."""

from __future__ import annotations

import pydantic
import pytest

from pdfleet.api.rules import error_paths
from pdfleet.api.types import format_duration, parse_duration, parse_quantity
from pdfleet.api.v1alpha1 import InferenceService
from tests.spec_cases import InvalidCase, invalid_cases, normalize_path, sample, sample_names

CASES = invalid_cases()


@pytest.mark.parametrize("name", sample_names())
def test_samples_are_valid(name: str) -> None:
    InferenceService.model_validate(sample(name))


def test_there_are_at_least_25_distinct_invalid_cases() -> None:
    assert len({case.id for case in CASES}) == len(CASES) >= 25
    assert len({case.field for case in CASES}) >= 25


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_invalid_spec_is_refused_naming_the_field(case: InvalidCase) -> None:
    with pytest.raises(pydantic.ValidationError) as refused:
        InferenceService.model_validate(case.obj)
    paths = [normalize_path(line.split(": ", 1)[0]) for line in error_paths(refused.value)]
    assert normalize_path(case.field) in paths, error_paths(refused.value)


def test_defaults_fill_a_minimal_spec() -> None:
    spec = InferenceService.model_validate(sample("minimal")).spec
    assert spec.kv_transfer.connector == "NixlConnector"
    assert spec.kv_transfer.side_channel_port == 5600
    assert spec.router.type == "vllm-router"
    assert spec.drain.timeout == "300s"
    assert spec.prefill.replicas.start == 1
    assert spec.prefill.tolerations[0].key == "nvidia.com/gpu"
    assert not spec.autoscaling.enabled


def test_role_lookup() -> None:
    spec = InferenceService.model_validate(sample("production")).spec
    assert spec.role("prefill").gpus_per_replica == 2
    assert spec.role("decode").gpus_per_replica == 4
    with pytest.raises(ValueError, match="unknown role"):
        spec.role("router")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("30s", 30.0), ("5m", 300.0), ("1h30m", 5400.0), ("1.5s", 1.5)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "-5s", "5 s", "1d", "s"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.41, "410ms"), (0.0185, "18ms"), (1.25, "1.25s"), (90, "90s")]
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("value", "number"),
    [(8, 8.0), ("500m", 0.5), ("20Gi", 20 * 2.0**30), ("1e3", 1000.0), ("2k", 2000.0)],
)
def test_parse_quantity(value: int | str, number: float) -> None:
    assert parse_quantity(value) == pytest.approx(number)


@pytest.mark.parametrize("value", ["lots", "1.2.3", "20GB", ""])
def test_parse_quantity_refuses(value: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(value)
