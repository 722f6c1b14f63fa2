# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""tpfix.core.wheelfile, the one reader of a wheel's METADATA, and the stages that
read Requires-Dist through it (image.repins, maint.start_line.wheel_cuda,
support_matrix.wheel_facts)."""

from __future__ import annotations

import pytest
from packaging.requirements import Requirement
from wheels import REQUIRES_PYTHON, VERSION, make_wheel

from tpfix.audit.support_matrix import wheel_facts
from tpfix.core.context import BuildContext
from tpfix.core.lines import get_line
from tpfix.core.util import Fail
from tpfix.core.wheelfile import wheel_arch, wheel_requirements
from tpfix.image.image import repins
from tpfix.maint.start_line import wheel_cuda
from tpfix.stages.verify import verify_wheel


def test_requires_dist_in_order_as_requirements(tmp_path):
    wheel = make_wheel(tmp_path, requires=("Foo_Bar[x]>=1; extra == 'y'", "regex"))
    reqs = wheel_requirements(wheel)
    assert reqs == [Requirement('foo-bar[x]>=1; extra == "y"'), Requirement("regex")]
    assert reqs[0].extras == {"x"} and str(reqs[0].marker) == 'extra == "y"'
    assert wheel_arch(wheel) == "x86_64"
    assert wheel_arch(wheel.with_name("vllm-1-cp38-abi3-manylinux_2_31_aarch64.whl")) == "aarch64"


def test_an_invalid_requirement_names_the_wheel(tmp_path):
    wheel = make_wheel(tmp_path, requires=("torch==2.9.0", "not a requirement!"))
    with pytest.raises(Fail) as e:
        wheel_requirements(wheel)
    assert str(e.value).startswith(
        f"{wheel}: METADATA: Requires-Dist 'not a requirement!' is not a valid requirement ("
    )
    assert "\n" not in str(e.value)


def test_repins_are_unconditional_exact_pins_the_official_lacks(tmp_path):
    same = ("Same_Project ==1.0", "regex")
    ours = make_wheel(
        tmp_path / "ours",
        requires=(
            *same,
            "flashinfer-python==0.6.16.post4",
            'torch==2.9.0; extra == "x"',
            "foo[bar]==1",
            "bar>=2",
            'baz==3; python_version >= "3.10"',
        ),
    )
    official = make_wheel(tmp_path / "official", requires=("same-project==1.0", "regex"))
    assert repins(ours, official) == [("flashinfer-python", "0.6.16.post4"), ("baz", "3")]


@pytest.mark.parametrize(
    ("requires", "cuda"),
    [
        (("flashinfer-python[cu13]==0.6", "regex"), "13.0"),
        (("nvidia-cutlass[cu12]>=4",), "12.9"),
        (("regex",), "12.8"),
    ],
)
def test_wheel_cuda_from_the_extras_of_requires_dist(tmp_path, requires, cuda):
    assert wheel_cuda(make_wheel(tmp_path, requires=requires), "12.8") == cuda


def test_wheel_facts_are_the_unconditional_pins(tmp_path):
    wheel = make_wheel(
        tmp_path,
        requires=(
            'torch==2.8.0; extra == "old"',
            "torch==2.9.0",
            "FlashInfer_Python==0.6.1",
        ),
    )
    facts = {"requires-python": REQUIRES_PYTHON, "torch": "2.9.0", "flashinfer": "0.6.1"}
    assert wheel_facts(wheel) == facts


def test_verify_flags_requires_dist_no_patch_pins(tmp_path):
    """verify_wheel compares the two wheels' Requires-Dist as requirements:
    spelling of the same requirement is no change, a new pin is."""
    base = ("regex",)
    built = make_wheel(tmp_path / "built", requires=(*base, "Same_Project ==1.0", "foo==1"))
    official = make_wheel(tmp_path / "official", requires=(*base, "same-project==1.0"))
    ctx = BuildContext.resolve(get_line()).but(version=VERSION, series=())
    problems = verify_wheel(built, official, tmp_path, ctx)
    assert problems == ["METADATA: Requires-Dist 'foo==1' changed, no patch pins it"]
    assert verify_wheel(official, official, tmp_path, ctx) == []
