"""Cross-field rules, written once and enforced twice.

Each rule carries its CEL expression (emitted into the CRD as an `x-kubernetes-validations`
entry, so the API server refuses a bad spec at admission) and the same predicate in Python (so
`pdfleet render`, the unit tests and the operator refuse it with the same message). The
invalid-spec cases in tests/cases/ replay against both. A `Rule` is on an object; a
`ValueRule` (in `Checked`) is on one value, such as a duration's range or an argument.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

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


@dataclass(frozen=True)
class ValueRule:
    """A rule on one value (a duration, an argument, a name) rather than on an object.

    It lands on the value's own schema, so the API server reports the value's path (e.g.
    spec.engine.extraArgs[2]) exactly as pydantic does. `problem` may name what is wrong in a
    message of its own, which `message_expression` computes the same way on the API server.
    """

    cel: str
    """The rule in CEL, with `self` bound to the value."""
    message: str
    """Shown by the API server when `message_expression` is empty."""
    problem: Callable[[Any], str | None]
    """The same rule in Python: None when the value passes, else the message."""
    message_expression: str = ""
    """CEL computing the message from `self` (the text `problem` returns)."""

    def crd_entry(self) -> dict[str, str]:
        entry = {"rule": self.cel, "message": self.message}
        if self.message_expression:
            entry["messageExpression"] = self.message_expression
        return entry


@dataclass(frozen=True)
class Checked:
    """`Annotated` metadata that checks a value's rules after its type and writes them into its
    schema: `Annotated[str, Checked((rule,))]`."""

    rules: tuple[ValueRule, ...]

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = dict(handler(schema))
        entries = [rule.crd_entry() for rule in self.rules]
        json_schema["x-kubernetes-validations"] = [
            *json_schema.get("x-kubernetes-validations", []),
            *entries,
        ]
        return json_schema

    def _check(self, value: Any) -> Any:
        for rule in self.rules:
            problem = rule.problem(value)
            if problem is not None:
                raise PydanticCustomError(RULE_ERROR, "{message}", {"message": problem})
        return value


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

    def wire(self, *, nulls: bool = False) -> dict[str, Any]:
        """The object as the API server stores it (camelCase JSON). Unset optional fields
        are left out, or sent as null with `nulls`: in a merge patch, null removes a field
        an earlier write set."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=not nulls)


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
