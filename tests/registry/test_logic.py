"""Guard evaluation from a key's stamps agrees with etcd's rules, without I/O."""

from __future__ import annotations

import operator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.registry import Compare, CompareOp, CompareTarget, KeyValue
from corral.registry._logic import compare_holds, stamp_compare_holds

STAMP_TARGETS = [CompareTarget.VERSION, CompareTarget.CREATE_REVISION, CompareTarget.MOD_REVISION]
OPS = {
    CompareOp.EQUAL: operator.eq,
    CompareOp.NOT_EQUAL: operator.ne,
    CompareOp.LESS: operator.lt,
    CompareOp.GREATER: operator.gt,
}
revisions = st.integers(min_value=0, max_value=50)


@given(
    target=st.sampled_from(STAMP_TARGETS),
    op=st.sampled_from(list(OPS)),
    value=revisions,
    stamps=st.none() | st.tuples(revisions, revisions, revisions),
)
def test_a_stamp_guard_reads_the_named_stamp_and_an_absent_key_as_zero(
    target: CompareTarget, op: CompareOp, value: int, stamps: tuple[int, int, int] | None
) -> None:
    compare = Compare("apps/a", target, op, value)
    create, mod, version = stamps or (0, 0, 0)
    actual = {
        CompareTarget.CREATE_REVISION: create,
        CompareTarget.MOD_REVISION: mod,
        CompareTarget.VERSION: version,
    }[target]
    expected = OPS[op](actual, value)
    assert stamp_compare_holds(compare, stamps) is expected
    kv = None if stamps is None else KeyValue("apps/a", b"v", create, mod, version)
    assert compare_holds(compare, kv) is expected


@pytest.mark.parametrize("value", [True, b"1", "1", 1.0])
def test_a_stamp_guard_needs_an_int(value: object) -> None:
    compare = Compare("apps/a", CompareTarget.MOD_REVISION, CompareOp.EQUAL, value)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="MOD_REVISION compare needs an int"):
        stamp_compare_holds(compare, (1, 2, 3))


def test_a_value_guard_is_not_evaluated_from_stamps() -> None:
    with pytest.raises(ValueError, match="VALUE compare is not evaluated from stamps"):
        stamp_compare_holds(Compare.value_is("apps/a", b"x"), (1, 2, 3))
