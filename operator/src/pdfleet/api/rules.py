"""Cross-field rules, written once and enforced twice.

Each rule carries its CEL expression (emitted into the CRD as an `x-kubernetes-validations`
entry, so the API server refuses a bad spec at admission) and the same predicate in Python (so
`pdfleet render`, the unit tests and the operator refuse it with the same message). The
invalid-spec cases in tests/cases/ replay against both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

RULE_ERROR = "cel_rule"


@dataclass(frozen=True)
class Rule:
    """One cross-field rule of an API object."""

    cel: str
    """The rule in CEL, evaluated by the API server with `self` bound to the object."""
    message: str
    """What is wrong and how to fix it; shown to the user by both validators."""
    check: Callable[[Any], bool]
    """The same rule in Python, given the validated model instance; True when it holds."""
    field: str = ""
    """The field the error is reported on, relative to the object (".initial"); empty for
    the object itself."""

    def crd_entry(self) -> dict[str, str]:
        entry = {"rule": self.cel, "message": self.message}
        # fieldPath must name a field of the schema; metadata has none, so a rule on
        # metadata.name reports on the object (its message names the field).
        if self.field and not self.field.startswith(".metadata."):
            entry["fieldPath"] = self.field
        return entry


def _schema_extra(schema: dict[str, Any], model: type[Any]) -> None:
    rules: tuple[Rule, ...] = getattr(model, "__rules__", ())
    if rules:
        schema["x-kubernetes-validations"] = [rule.crd_entry() for rule in rules]


class ApiModel(BaseModel):
    """Base of every API model: camelCase on the wire, unknown fields refused, rules checked."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        # No coercion ("3" is not 3, "yes" is not true): the API server's schema takes JSON
        # types as they are, and both validators must agree.
        strict=True,
        frozen=True,
        json_schema_extra=_schema_extra,
    )
    __rules__: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> ApiModel:
        for rule in self.__rules__:
            if not rule.check(self):
                raise PydanticCustomError(
                    RULE_ERROR, "{message}", {"message": rule.message, "field": rule.field}
                )
        return self


def error_paths(error: ValidationError) -> list[str]:
    """Each error of a validation as "spec.prefill.replicas.initial: message".

    Rule errors are attached to the field the rule names, like the API server does with a CEL
    rule's fieldPath, so both validators report the same path.
    """
    lines = []
    for item in error.errors():
        path = ".".join(str(part) for part in item["loc"])
        ctx = item.get("ctx") or {}
        if item["type"] == RULE_ERROR and ctx.get("field"):
            path = f"{path}{ctx['field']}" if path else str(ctx["field"]).lstrip(".")
        lines.append(f"{path}: {item['msg']}")
    return lines
