"""`portkern.base.records`: dataclasses to and from plain data."""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field
from typing import Mapping, Optional, Sequence, Union

import pytest

from portkern.base.records import from_plain, frozen_record, record, to_plain, wire


@dataclass(frozen=True)
class Point:
    x: int
    y: int = 0


@dataclass(frozen=True)
class Shape:
    name: str
    points: tuple[Point, ...]
    dims: tuple[tuple[Union[int, str], ...], ...] = ()
    rules: Mapping[str, Union[str, tuple[int, ...]]] = field(default_factory=dict, metadata=wire(omit=True))
    origin: Optional[Point] = field(default=None, metadata=wire(omit=True))
    size: tuple[int, ...] = field(default=(), metadata=wire(name="global"))
    pairs: tuple[tuple[str, str], ...] = field(default=(), metadata=wire(encode=dict, decode=lambda d: tuple(sorted(d.items()))))
    note: str = field(default="", metadata=wire(omit=lambda shape: not shape.points))


def test_round_trip_keeps_field_order_and_types():
    shape = Shape("s", (Point(1, 2), Point(3)), (("M", 4),), {"M": (8, 16), "N": "exact"}, Point(0), (2, 3), (("a", "1"),), "n")
    data = to_plain(shape)
    assert list(data) == ["name", "points", "dims", "rules", "origin", "global", "pairs", "note"]
    assert data == {
        "name": "s", "points": [{"x": 1, "y": 2}, {"x": 3, "y": 0}], "dims": [["M", 4]], "rules": {"M": [8, 16], "N": "exact"},
        "origin": {"x": 0, "y": 0}, "global": [2, 3], "pairs": {"a": "1"}, "note": "n",
    }
    assert from_plain(Shape, data) == shape


def test_omitted_fields_come_back_as_defaults():
    shape = Shape("s", ())
    assert to_plain(shape) == {"name": "s", "points": [], "dims": [], "global": [], "pairs": {}}
    assert from_plain(Shape, to_plain(shape)) == shape


def test_unknown_keys_are_ignored_and_missing_fields_are_type_errors():
    assert from_plain(Point, {"x": 1, "z": 9}) == Point(1)
    with pytest.raises(TypeError, match="'x' is missing"):
        from_plain(Point, {"y": 1})
    with pytest.raises(TypeError):
        from_plain(Point, [1, 2])


def test_values_that_do_not_fit_the_hints_are_kept_as_they_are():
    assert from_plain(Shape, {"name": "s", "points": 5}).points == 5


@dataclass(frozen=True)
class Layout:
    pair: tuple[Point, int]
    rows: list[Point]
    seen: Sequence[tuple[int, ...]] = ()
    either: Union[tuple[Point, ...], Point, None] = None


def test_fixed_tuples_lists_sequences_and_union_arms_in_order():
    data = {"pair": [{"x": 1}, 2], "rows": [{"x": 3, "y": 4}], "seen": [[1, 2], []], "either": [{"x": 5}]}
    assert from_plain(Layout, data) == Layout((Point(1), 2), [Point(3, 4)], [(1, 2), ()], (Point(5),))
    assert from_plain(Layout, {**data, "either": {"x": 6}}).either == Point(6)
    assert from_plain(Layout, {**data, "pair": [{"x": 1}]}).pair == ({"x": 1},)  # not the hint's length: a tuple as it is
    assert to_plain(from_plain(Layout, data)) == {**data, "pair": [{"x": 1, "y": 0}, 2], "rows": [{"x": 3, "y": 4}],
                                                  "either": [{"x": 5, "y": 0}]}


def _twins(**options):
    """The same record declared with `frozen_record` and with `dataclass(frozen=True)`."""

    def body():
        return {
            "__annotations__": {"a": "int", "b": "str", "skipped": "tuple", "hidden": "int", "unhashed": "int"},
            "b": "x",
            "skipped": field(default=(), compare=False),
            "hidden": field(default=0, repr=False),
            "unhashed": field(default=0, hash=False),
            "__module__": __name__,
        }

    return frozen_record(type("Twin", (), body()), **options), dataclass(frozen=True, **options)(type("Twin", (), body()))


@pytest.mark.parametrize("options", [{}, {"kw_only": True}, {"slots": True}])
def test_frozen_records_behave_as_frozen_dataclasses(options):
    """`frozen_record`: repr, equality, hashing, immutability and the dataclass API as
    `dataclass(frozen=True)` gives them."""
    import copy
    import dataclasses

    ours, theirs = _twins(**options)
    values = [dict(a=1, b="q", skipped=(1,), hidden=2, unhashed=3), dict(a=1, b="q", skipped=(), hidden=2, unhashed=3),
              dict(a=1, b="q", hidden=2, unhashed=4), dict(a=2), dict(a=1, hidden=5)]
    made = [(ours(**v), theirs(**v)) for v in values]
    # (Python 3.10-3.11's dataclasses raise TypeError on adding an attribute to a frozen record with slots.)
    added_error = (dataclasses.FrozenInstanceError, TypeError) if options.get("slots") else dataclasses.FrozenInstanceError
    for x, tx in made:
        assert repr(x) == repr(tx)
        assert hash(x) == hash(tx)
        assert dataclasses.is_dataclass(x) and dataclasses.asdict(x) == dataclasses.asdict(tx)
        assert dataclasses.replace(x, a=7).a == 7
        for made_one in (x, tx):  # the frozen guards alike: no field set again, nothing added or deleted
            with pytest.raises(dataclasses.FrozenInstanceError):
                made_one.a = 9
            with pytest.raises(dataclasses.FrozenInstanceError):
                made_one.unhashed = 9  # (a field holding its default)
            with pytest.raises(added_error):
                made_one.other = 1
            with pytest.raises(dataclasses.FrozenInstanceError):
                del made_one.a
        assert (x.a, x.b) == (tx.a, tx.b)
        assert copy.copy(x) == x and copy.deepcopy(x) == x and dataclasses.replace(x) == x
        for y, ty in made:
            assert (x == y) == (tx == ty) and (x != y) == (tx != ty)
        assert x != tx and (x == 1) is False  # another class, another type: never equal
    assert {made[0][0], made[1][0]} == {made[0][0]}  # equal (skipped is not compared) and hashed alike


def test_frozen_records_keep_the_methods_a_class_defines():
    @frozen_record
    class Named:
        name: str
        size: int = 0

        def __eq__(self, other):
            return isinstance(other, Named) and self.name == other.name

        def __repr__(self):
            return f"<{self.name}>"

    @dataclass(frozen=True)
    class Twin:
        name: str
        size: int = 0

        def __eq__(self, other):
            return isinstance(other, Twin) and self.name == other.name

    assert Named("a", 1) == Named("a", 2) and repr(Named("a")) == "<a>"
    assert hash(Named("a", 1)) == hash(Twin("a", 1))  # dataclasses hashes every field where the class gives only __eq__


def test_frozen_records_inherit_and_set_their_own_derived_fields():
    """A record that extends another, and one whose `__post_init__` fills a field `__init__` does
    not take, stay frozen as `dataclass(frozen=True)` records do."""
    import dataclasses

    @frozen_record
    class Base:
        name: str
        size: int = 0

    @frozen_record
    class Sized(Base):
        unit: str = "B"
        label: str = field(init=False, default="")

        def __post_init__(self):
            object.__setattr__(self, "label", f"{self.name}:{self.size}{self.unit}")

    made = Sized("a", 2)
    assert (made.name, made.size, made.unit, made.label) == ("a", 2, "B", "a:2B")
    assert made == Sized("a", 2) and made != Sized("a", 3) and hash(made) == hash(Sized("a", 2))
    for name in ("name", "unit", "label"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(made, name, "x")
    assert dataclasses.replace(made, size=5).label == "a:5B"


def _init_twins(declare):
    """One record with every kind of field `__init__` handles, declared with `declare` and with the
    matching `dataclass`."""
    import dataclasses

    def body():
        return {
            "__annotations__": {"a": "int", "b": "list", "c": "str", "derived": "int", "plain": "int", "named": "int"},
            "b": field(default_factory=list),
            "c": "x",
            "derived": field(init=False, default=7),
            "plain": field(init=False, default_factory=lambda: 8),
            "named": field(default=0, kw_only=True),
            "__module__": __name__,
        }

    frozen = declare is frozen_record
    return declare(type("Twin", (), body())), dataclasses.dataclass(frozen=frozen)(type("Twin", (), body()))


@pytest.mark.parametrize("declare", [frozen_record, record], ids=["frozen_record", "record"])
def test_records_take_their_arguments_as_dataclasses_do(declare):
    """The shared `__init__`: the same fields set from the same arguments (by position, by name,
    defaults, default factories called for each record, keyword-only fields, fields `__init__` does
    not take), the same TypeErrors for arguments a dataclass refuses, and the same signature."""
    import dataclasses
    import inspect

    ours, theirs = _init_twins(declare)
    for args, kwargs in [((1,), {}), ((1, [2], "y"), {"named": 3}), ((), {"a": 1, "c": "z"}), ((1,), {"b": [5]})]:
        x, tx = ours(*args, **kwargs), theirs(*args, **kwargs)
        assert vars(x) == vars(tx) and list(vars(x)) == list(vars(tx))  # the same fields, set in the same order
        assert repr(x) == repr(tx) and dataclasses.asdict(x) == dataclasses.asdict(tx)
    assert ours(1).b is not ours(1).b  # a factory's value per record
    for args, kwargs in [((), {}), ((1, [], "y", 4), {}), ((1,), {"a": 2}), ((1,), {"derived": 2}), ((1,), {"other": 2}), ((1, [], "y"), {"c": "z"})]:
        with pytest.raises(TypeError):
            theirs(*args, **kwargs)
        with pytest.raises(TypeError):
            ours(*args, **kwargs)
    assert str(inspect.signature(ours)) == str(inspect.signature(theirs))
    assert dataclasses.replace(ours(1, named=2), c="q") == ours(1, c="q", named=2)


def test_mutable_records_behave_as_dataclasses():
    """`record`: fields can be set again, equality by fields, unhashable, as `dataclass()` makes them."""
    ours, theirs = _init_twins(record)
    x = ours(1)
    x.a = 5
    assert x.a == 5 and x == ours(5) and x != ours(6) and (x == theirs(5)) is False
    assert ours.__hash__ is None and theirs.__hash__ is None
    with pytest.raises(TypeError):
        hash(x)


def test_records_with_init_vars_keep_dataclasses_init():
    """An `InitVar` goes to `__post_init__` through dataclasses' own `__init__`."""

    @frozen_record
    class Scaled:
        value: int
        scale: InitVar[int] = 1
        scaled: int = field(init=False, default=0)

        def __post_init__(self, scale):
            object.__setattr__(self, "scaled", self.value * scale)

    assert Scaled(2, 3).scaled == 6 and Scaled(2).scaled == 2
