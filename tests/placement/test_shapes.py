"""A configured pod-shape mix: its YAML form, read back exactly, and bad entries named."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from webhook.placement.shapes import MixError, Shape, ShapeMix, mix_entries, parse_mix


def test_weights_are_relative_and_a_shape_listed_twice_adds_up() -> None:
    mix = parse_mix([{"cpu": 8000, "gpus": 1, "weight": 3}, {"cpu": 16500, "weight": 2},
                     {"cpu": 4000, "gpus": 1, "gpuMilli": 500, "products": ["T4", "T4"], "weight": 1},
                     {"cpu": 8000, "gpus": 1, "weight": 2}])
    assert mix.shapes == (Shape(8000, 1000, 1), Shape(16500), Shape(4000, 500, 1, ("T4",)))
    assert mix.weights == pytest.approx((5 / 8, 2 / 8, 1 / 8))


shapes = st.builds(lambda cpu, gpus, milli, products: Shape(cpu, milli if gpus == 1 else 1000 * bool(gpus), gpus,
                                                            tuple(sorted(set(products)))),
                   st.integers(0, 128_000), st.integers(0, 8), st.integers(1, 1000),
                   st.lists(st.sampled_from(["T4", "A10", "NVIDIA-H100-80GB-HBM3"]), max_size=2))


@given(st.dictionaries(shapes, st.integers(1, 10_000), min_size=1, max_size=40))
def test_a_learned_mix_written_as_yaml_reads_back_equal(counts: dict[Shape, int]) -> None:
    """What gpugate replay writes (pod-mix.yaml) is the mix the balancer then serves, exactly."""
    mix = ShapeMix.from_counts(counts)
    assert parse_mix(yaml.safe_load(yaml.safe_dump(mix_entries(mix)))) == mix


@pytest.mark.parametrize(("entries", "message"), [
    (None, "a non-empty list"),
    ([], "a non-empty list"),
    (["cpu: 1"], "mix[0]: a shape is a mapping"),
    ([{"cpu": 1000}], "mix[0]: weight must be a number above 0, got None"),
    ([{"cpu": 1000, "weight": True}], "weight must be a number above 0, got True"),
    ([{"cpu": 1.5, "weight": 1}], "cpu must be a whole number of at least 0, got 1.5"),
    ([{"cpu": 1, "gpus": 1, "gpuMilli": 1001, "weight": 1}], "gpuMilli must be 1-1000"),
    ([{"cpu": 1, "gpus": 1, "products": "T4", "weight": 1}], "products must be a list of GPU product names"),
])
def test_bad_entries_are_refused_with_the_entry_and_field_named(entries, message: str) -> None:
    with pytest.raises(MixError, match=None) as err:
        parse_mix(entries)
    assert message in str(err.value)
