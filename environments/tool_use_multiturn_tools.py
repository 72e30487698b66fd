"""The tools `tool_use_multiturn_server.py` executes, and the tasks it generates for them.

Design decisions:

- **Deterministic, pure Python, no eval.** `calculator` parses arithmetic with a small
  recursive-descent parser (numbers, + - * / // % ** and ^, parentheses, unary signs),
  with limits on input length, exponents and result size, so a policy cannot hang or
  crash the env. `convert_units` multiplies by fixed factors (temperatures by formula).
  `country_info` reads one field of a small table shipped beside the env
  (`data/tool_use_multiturn/countries.jsonl`: approximate 2023 figures; the answers are
  computed from the table, so the reward is exact whatever the world's latest numbers).
- **Results are JSON**, errors too (`{"error": ...}`), so a model reads every result the
  same way and a bad call is a recoverable turn, not a crash.
- **Tasks come from a seed.** `task_for(seed, index)` builds the index-th task with its
  own `random.Random`, so the training stream and the evaluation set are reproducible
  and never need a dataset. Each task carries `plan`, a sequence of calls that solves
  it, which the tests execute to prove every answer is reachable with the tools.
"""

from __future__ import annotations

import json
import math
import random
import re
from functools import cache
from pathlib import Path
from typing import Any

TABLE = Path(__file__).resolve().parent / "data" / "tool_use_multiturn" / "countries.jsonl"
FIELDS = ("capital", "population", "area_km2", "highest_point", "highest_point_m", "currency")
KINDS = ("arithmetic", "conversion", "lookup", "density", "elevation")
MAX_EXPRESSION = 200
MAX_MAGNITUDE = 1e15


class ToolError(ValueError):
    """A call the tool cannot answer; its message goes back to the model."""


# ---------------------------------------------------------------- calculator
TOKEN = re.compile(r"\s*(\d+\.?\d*|\.\d+|\*\*|//|[-+*/%^()])")


def _tokens(expression: str) -> list[str]:
    tokens, position = [], 0
    expression = expression.rstrip()
    while position < len(expression):
        found = TOKEN.match(expression, position)
        if not found:
            raise ToolError(f"unexpected character {expression[position:].strip()[:1]!r}")
        tokens.append(found.group(1))
        position = found.end()
    return tokens


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.i = tokens, 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise ToolError("the expression ends too early")
        self.i += 1
        return token

    def expression(self) -> float:
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
        return value

    def term(self) -> float:
        value = self.unary()
        while self.peek() in ("*", "/", "//", "%"):
            op, right = self.take(), self.unary()
            if op == "*":
                value *= right
            elif right == 0:
                raise ToolError("division by zero")
            else:
                value = (
                    value / right if op == "/" else value // right if op == "//" else value % right
                )
            _check(value)
        return value

    def unary(self) -> float:
        if self.peek() in ("+", "-"):
            return -self.unary() if self.take() == "-" else self.unary()
        return self.power()

    def power(self) -> float:
        base = self.atom()
        if self.peek() in ("**", "^"):
            self.take()
            exponent = self.unary()
            if abs(exponent) > 64:
                raise ToolError("exponent too large")
            if base == 0 and exponent < 0:
                raise ToolError("division by zero")
            value = base**exponent
            if isinstance(value, complex):
                raise ToolError("no real result")
            return _check(value)
        return base

    def atom(self) -> float:
        token = self.take()
        if token == "(":
            value = self.expression()
            if self.take() != ")":
                raise ToolError("missing ')'")
            return value
        if token[0].isdigit() or token[0] == ".":
            return float(token) if "." in token else int(token)
        raise ToolError(f"unexpected {token!r}")


def _check(value: float) -> float:
    if isinstance(value, float) and not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
        raise ToolError("result too large")
    return value


def number_out(value: float) -> int | float:
    """A result as JSON shows it: whole numbers as ints, others to 10 significant digits."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return float(f"{value:.10g}") if isinstance(value, float) else value


def calculate(expression: str) -> int | float:
    """The value of an arithmetic expression (ToolError when it is not one)."""
    if not isinstance(expression, str) or not expression.strip():
        raise ToolError("expression must be a non-empty string")
    if len(expression) > MAX_EXPRESSION:
        raise ToolError(f"expression longer than {MAX_EXPRESSION} characters")
    parser = _Parser(_tokens(expression.replace(",", "")))
    value = parser.expression()
    if parser.peek() is not None:
        raise ToolError(f"unexpected {parser.peek()!r}")
    return number_out(_check(value))


# ---------------------------------------------------------------- units
FACTORS = {  # unit -> (dimension, factor to the base unit)
    "m": ("length", 1.0), "km": ("length", 1000.0), "cm": ("length", 0.01),
    "mm": ("length", 0.001), "mi": ("length", 1609.344), "ft": ("length", 0.3048),
    "in": ("length", 0.0254), "yd": ("length", 0.9144),
    "kg": ("mass", 1.0), "g": ("mass", 0.001), "lb": ("mass", 0.45359237),
    "oz": ("mass", 0.028349523125), "t": ("mass", 1000.0),
    "l": ("volume", 1.0), "ml": ("volume", 0.001), "gal": ("volume", 3.785411784),
    "cup": ("volume", 0.2365882365),
}  # fmt: skip
TEMPERATURES = ("c", "f", "k")
ALIASES = {
    "meter": "m", "metre": "m", "kilometer": "km", "kilometre": "km", "centimeter": "cm",
    "centimetre": "cm", "millimeter": "mm", "millimetre": "mm", "mile": "mi", "foot": "ft",
    "feet": "ft", "inch": "in", "inches": "in", "yard": "yd", "kilogram": "kg", "gram": "g",
    "pound": "lb", "lbs": "lb", "ounce": "oz", "tonne": "t", "liter": "l", "litre": "l",
    "milliliter": "ml", "millilitre": "ml", "gallon": "gal", "celsius": "c", "fahrenheit": "f",
    "kelvin": "k", "°c": "c", "°f": "f",
}  # fmt: skip
UNIT_NAMES = {"m": "metres", "km": "kilometres", "mi": "miles", "ft": "feet", "in": "inches",
              "cm": "centimetres", "kg": "kilograms", "lb": "pounds", "oz": "ounces",
              "g": "grams", "l": "litres", "gal": "US gallons", "ml": "millilitres",
              "c": "degrees Celsius", "f": "degrees Fahrenheit", "k": "kelvin"}  # fmt: skip


def unit(name: Any) -> str:
    key = str(name).strip().lower().rstrip(".")
    key = ALIASES.get(key, ALIASES.get(key.rstrip("s"), key))
    if key not in FACTORS and key not in TEMPERATURES:
        raise ToolError(f"unknown unit {name!r}")
    return key


def convert(value: Any, from_unit: Any, to_unit: Any) -> int | float:
    """`value` in `from_unit` expressed in `to_unit` (ToolError for unknown/mixed units)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ToolError("value must be a number")
    source, target = unit(from_unit), unit(to_unit)
    if source in TEMPERATURES or target in TEMPERATURES:
        if source not in TEMPERATURES or target not in TEMPERATURES:
            raise ToolError(f"cannot convert {from_unit!r} to {to_unit!r}")
        kelvin = {"c": value + 273.15, "f": (value - 32) * 5 / 9 + 273.15, "k": value}[source]
        out = {"c": kelvin - 273.15, "f": (kelvin - 273.15) * 9 / 5 + 32, "k": kelvin}[target]
        return number_out(float(out))
    (dimension, factor), (other, to_factor) = FACTORS[source], FACTORS[target]
    if dimension != other:
        raise ToolError(f"cannot convert {dimension} to {other}")
    return number_out(value * factor / to_factor)


# ---------------------------------------------------------------- table
@cache
def countries() -> dict[str, dict[str, Any]]:
    rows = [json.loads(line) for line in TABLE.read_text().splitlines() if line.strip()]
    return {row["country"].casefold(): row for row in rows}


def country_info(country: Any, field: Any) -> Any:
    row = countries().get(str(country).strip().casefold())
    if row is None:
        raise ToolError(f"no country {country!r} in the table")
    if field not in FIELDS:
        raise ToolError(f"unknown field {field!r}; fields: {', '.join(FIELDS)}")
    return row[field]


# ---------------------------------------------------------------- the tool interface
def _tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": parameters}}  # fmt: skip


TOOLS = [
    _tool(
        "calculator",
        "Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses.",
        {"expression": {"type": "string", "description": "e.g. (12.5 + 3) * 4"}},
        ["expression"],
    ),
    _tool(
        "convert_units",
        "Convert a quantity between units of length, mass, volume or temperature.",
        {
            "value": {"type": "number"},
            "from_unit": {"type": "string", "description": "e.g. km, mi, ft, kg, lb, l, gal, C"},
            "to_unit": {"type": "string"},
        },
        ["value", "from_unit", "to_unit"],
    ),
    _tool(
        "country_info",
        "Look up one fact about a country in the reference table.",
        {"country": {"type": "string"}, "field": {"type": "string", "enum": list(FIELDS)}},
        ["country", "field"],
    ),
]


def execute(name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
    """(JSON result, ok) of one call; unknown tools and bad arguments give an error result."""
    try:
        if name == "calculator":
            value = calculate(arguments.get("expression"))
            return json.dumps({"result": value}), True
        if name == "convert_units":
            value = convert(arguments.get("value"), arguments.get("from_unit"),
                            arguments.get("to_unit"))  # fmt: skip
            return json.dumps({"value": value, "unit": str(arguments.get("to_unit"))}), True
        if name == "country_info":
            value = country_info(arguments.get("country"), arguments.get("field"))
            return json.dumps({"value": value}), True
        raise ToolError(f"unknown tool {name!r}; tools: calculator, convert_units, country_info")
    except (ToolError, RecursionError) as error:
        message = str(error) if isinstance(error, ToolError) else "expression nested too deeply"
        return json.dumps({"error": message}), False


# ---------------------------------------------------------------- tasks
def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


CONVERSIONS = [("km", "mi"), ("mi", "km"), ("kg", "lb"), ("lb", "kg"), ("ft", "m"),
               ("m", "ft"), ("l", "gal"), ("gal", "l"), ("c", "f"), ("f", "c"),
               ("in", "cm"), ("oz", "g")]  # fmt: skip
LOOKUPS = {"capital": "What is the capital of {}?", "currency": "Which currency code does {} use?",
           "highest_point": "What is the name of the highest point of {}?"}  # fmt: skip


def task_for(seed: int, index: int, kinds: tuple[str, ...] = KINDS) -> dict[str, Any]:
    """The `index`-th task of the stream `seed`: question, answer, rounding and a plan."""
    rng = random.Random(f"{seed}:{index}")
    kind = kinds[rng.randrange(len(kinds))]
    country = rng.choice(sorted(countries().values(), key=lambda r: r["country"]))
    name = country["country"]
    if kind == "arithmetic":
        a, b, c = rng.randint(100, 9999), rng.randint(11, 99), rng.randint(100, 9999)
        if rng.random() < 0.5:
            expression, decimals, rounding = f"{a} * {b} - {c}", None, "the exact result"
        else:
            expression, decimals, rounding = f"({a} + {c}) / {b}", 2, "it rounded to 2 decimals"
        question = f"Use the calculator to work out {expression}; give {rounding}."
        plan = [_call("calculator", expression=expression)]
        answer: Any = calculate(expression)
    elif kind == "conversion":
        source, target = rng.choice(CONVERSIONS)
        value = round(rng.uniform(1, 500), 1)
        question = (f"How many {UNIT_NAMES[target]} is {value} {UNIT_NAMES[source]}? "
                    "Round to 2 decimals.")  # fmt: skip
        plan = [_call("convert_units", value=value, from_unit=source, to_unit=target)]
        answer, decimals = convert(value, source, target), 2
    elif kind == "lookup":
        field = rng.choice(sorted(LOOKUPS))
        question, decimals = LOOKUPS[field].format(name), None
        plan = [_call("country_info", country=name, field=field)]
        answer = country[field]
    elif kind == "density":
        question = (f"What is the population density of {name} in people per square "
                    "kilometre, rounded to the nearest whole number?")  # fmt: skip
        expression = f"{country['population']} / {country['area_km2']}"
        plan = [_call("country_info", country=name, field="population"),
                _call("country_info", country=name, field="area_km2"),
                _call("calculator", expression=expression)]  # fmt: skip
        answer, decimals = calculate(expression), 0
    elif kind == "elevation":
        question = f"How high is the highest point of {name} in feet, to the nearest foot?"
        metres = country["highest_point_m"]
        plan = [_call("country_info", country=name, field="highest_point_m"),
                _call("convert_units", value=metres, from_unit="m", to_unit="ft")]  # fmt: skip
        answer, decimals = convert(metres, "m", "ft"), 0
    else:
        raise ValueError(f"unknown task kind {kind!r}; kinds: {', '.join(KINDS)}")
    if decimals is not None:
        answer = round(float(answer), decimals) if decimals else int(round(float(answer)))
    return {"seed": seed, "index": index, "kind": kind, "question": question,
            "answer": answer, "decimals": decimals, "plan": plan}  # fmt: skip
