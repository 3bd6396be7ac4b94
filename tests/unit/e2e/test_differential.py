"""e2e/scenarios/differential.py's pure comparison: what is a difference, what is on purpose."""

from __future__ import annotations

from e2e.scenarios import differential as d

PAGE = """# HELP vllm:num_requests_running Running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
# HELP vllm:prompt_tokens_total Prompt tokens.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 3.0
# HELP vllm:ttft TTFT.
# TYPE vllm:ttft histogram
vllm:ttft_bucket{engine="0",le="0.1",model_name="m"} 1.0
vllm:ttft_bucket{engine="0",le="+Inf",model_name="m"} 1.0
vllm:ttft_count{engine="0",model_name="m"} 1.0
vllm:ttft_sum{engine="0",model_name="m"} 0.05
# HELP python_info Python.
# TYPE python_info gauge
python_info{version="3.11"} 1.0
"""


def observation(page: str = PAGE, **changes: object) -> d.Observation:
    fams = d.families(page)
    obs = d.Observation(
        families={"prefill": fams, "decode": fams},
        kv_params={"remote_block_ids": [["number"]], "remote_registration_generation": "number"},
        completion={"id": "string"},
        chat={"id": "string"},
        decode_cases={"valid": (200, "external_kv_transfer")},
        models={"object": "string"},
        health={"prefill": 200, "decode": 200},
    )
    for key, value in changes.items():
        setattr(obs, key, value)
    return obs


def test_families_read_types_labels_and_buckets_as_a_scraper_does() -> None:
    fams = d.families(PAGE)
    assert fams["vllm:prompt_tokens_total"] == d.Family(
        "counter", frozenset({"engine", "model_name"})
    )
    assert fams["vllm:ttft"].buckets == (0.1,)
    assert fams["vllm:ttft"].label_names == frozenset({"engine", "model_name"})


def test_json_shape_keeps_keys_and_types() -> None:
    shape = d.json_shape({"a": [[1, 2]], "b": None, "c": "x", "d": True, "e": []})
    assert shape == {"a": [["number"]], "b": "null", "c": "string", "d": "bool", "e": []}


def test_identical_observations_differ_in_nothing() -> None:
    assert d.differences(observation(), observation()) == []


def test_every_kind_of_mismatch_is_named() -> None:
    real = observation()
    sim = observation(
        page=PAGE.replace('le="0.1"', 'le="0.2"').replace("vllm:num_requests_running", "x"),
        decode_cases={"valid": (200, "local_compute")},
        health={"prefill": 200, "decode": 503},
    )
    found = "\n".join(d.differences(sim, real))
    assert "vllm:num_requests_running: missing in the simulator" in found
    assert "vllm:ttft: simulator" in found
    assert "decode, valid" in found and "/health" in found


def test_on_purpose_families_and_the_033_key_are_not_differences() -> None:
    real = observation(page=PAGE, kv_params={"remote_block_ids": [["number"]]})
    sim = observation(page=PAGE.split("# HELP python_info")[0])
    assert d.differences(sim, real) == []
    # The simulator follows 0.33: without its key it differs.
    sim_032 = observation(page=PAGE, kv_params={"remote_block_ids": [["number"]]})
    assert d.differences(sim_032, real) == [
        "kv_transfer_params: the simulator lacks 0.33's ['remote_registration_generation']"
    ]


def test_a_recorded_observation_round_trips_through_json() -> None:
    obs = observation()
    assert d.from_json(d.to_json(obs)) == obs
