"""Open enumerations: choices that files register, as torchtitan registers pipeline
schedules by name and Vidur its schedulers.

A :class:`Named` subclass (``Schedule``, ``Engine``) behaves as a ``str`` enum to every
reader (iterable in registration order, ``Kind("name")`` looks a member up and raises
``ValueError`` for an unknown one, members compare and hash as their names and carry
``.value`` and ``.name``), but its members come from :meth:`Named._add`, called by the one
file that defines each (its ``spec`` says everything the rest of autoplan asks of it). So a
new schedule or serving engine is a new file, not an edit of every place that lists them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar, TypeVar

N = TypeVar("N", bound="Named")


class _Registry(type):
    """Iterating the class gives its members in registration order; calling it with a name
    gives the registered member (``ValueError`` for another name)."""

    _members: dict[str, Any]

    def __iter__(cls) -> Iterator[Any]:
        return iter(list(cls._members.values()))

    def __len__(cls) -> int:
        return len(cls._members)

    def __contains__(cls, item: object) -> bool:
        return isinstance(item, str) and str(item) in cls._members

    def __call__(cls, value: Any) -> Any:
        found = cls._members.get(str(value)) if isinstance(value, str) else None
        if found is None:
            kind = getattr(cls, "KIND", "choice")
            raise ValueError(f"{value!r} is not a {kind}; known: {', '.join(cls._members)}")
        return found


class Named(str, metaclass=_Registry):
    """A registered choice (module doc). Each subclass keeps its own members."""

    KIND: ClassVar[str] = "choice"  # what a member is, in words (error messages)
    _members: ClassVar[dict[str, Any]]
    spec: Any  # the registering file's description of the member
    rank: int  # registration order

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._members = {}

    @classmethod
    def _add(cls: type[N], name: str, attr: str, spec: Any) -> N:
        """A new member ``name`` (``cls.<attr>``) described by ``spec``."""
        if name in cls._members:
            raise ValueError(f"{cls.KIND} {name!r} is registered already")
        member = str.__new__(cls, name)
        member.spec = spec
        member.rank = len(cls._members)
        cls._members[name] = member
        setattr(cls, attr, member)
        return member

    @classmethod
    def _remove(cls, member: Named, attr: str) -> None:
        """Forget a member (tests that register one of their own)."""
        del cls._members[member.value]
        if cls.__dict__.get(attr) is member:
            delattr(cls, attr)

    @property
    def value(self) -> str:
        return str.__str__(self)

    @property
    def name(self) -> str:
        """Its Python name (``Schedule.ONE_F_ONE_B``), as an enum member's."""
        return str(self.spec.attr)

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self.name}: {self.value!r}>"

    def __reduce__(self) -> tuple[Any, ...]:  # pickled by name (forked sweeps, validate specs)
        return (type(self), (self.value,))

    def __copy__(self: N) -> N:
        return self

    def __deepcopy__(self: N, memo: dict[int, Any]) -> N:
        return self
