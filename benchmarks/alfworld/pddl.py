"""ALFWorld's PDDL domain read from the `alfworld` wheel, a plan validator in the spirit of VAL, and the mapping
of our offline games (`games.py`) onto that domain.

`read_domain()` parses `alfworld/data/alfred.pddl`: its types, predicates, functions and actions (typed
parameters; preconditions and effects with and/or/not/imply/exists/forall/when/= and `increase` of the cost).
`validate(domain, problem, plan)` checks each ground action's parameter types and precondition in the current
state, applies its effects (every `when` condition read in the state before the action, deletes before adds,
as in PDDL) and at the end checks the goal; the first failure names the step, its command, the ground action
and the part of the precondition that does not hold.

The mapping: `game_problem(game)` builds the objects, initial state and goal of a stored game, and
`game_plan(game)` the ground action of each command of its walkthrough. Commands are matched with the action
templates of the wheel's grammar `alfworld/data/alfred.twl2` (`go to {r}` -> GotoLocation, `take {o} from {r}`
-> PickupObject, `move {o} to {r}` -> PutObject, `use {o}` -> ToggleObject, ...), keeping those whose action
the domain defines. Goals are the wheel's `alfworld/gen/goal_library.py` formulas for the six task types.

Locations: ALFWorld's domain has the agent at a location (`atLocation`), each receptacle at the location the
agent goes to for it (`receptacleAtLocation`, static) and `go to {r}` as GotoLocation(agent, lStart, lEnd, r)
with (receptacleAtLocation r lEnd). Our text simulation keeps only "the receptacle the agent is at", starting
at none ("the middle of the room"). Mapped: one location `loc_<receptacle>` per receptacle and `loc_start`,
the agent's start, where no receptacle is; "at receptacle X" is (atLocation agent1 loc_X). (In THOR two
receptacles may share a location; in our rooms none do.)

Every stored walkthrough is a valid plan here that first reaches its goal at its last step
(tests/test_alfworld_pddl.py). Our simulation (`benchmarks/envs/household.py`, since its SIMULATION_VERSION 2)
matches this domain off those plans too: over random command sequences (admissible commands and others) it
accepts a command exactly when the validator accepts the command's ground action, its state is the validator's
state, and it is won exactly when the goal formula holds. In particular it matches on the points where it used
to be more lenient: `move` only into a receptacle whose type can contain the object (canContain); heat/cool/
clean only of heatable/coolable/cleanable objects; `open` only of a closed and `close` only of an open
receptacle; `examine` of an object only when held or in an open (or not openable) receptacle where the agent
is; heating undoes cooling and the reverse; pick-two wants both objects in one receptacle; an object that
starts in a fridge is cool. Commands that match no template of the grammar (`put`, unknown names) have no
ground action; the simulation answers them "Nothing happens.".

Stdlib only; the wheel's files are read (`goal_library.py` and `constants.py` executed on their own, as
`games.py` does), the alfworld package is never imported.
"""

from __future__ import annotations

import itertools
import re
import runpy
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from a2rl_bench.benchmarks.alfworld.games import constants, wheel_dir

SExpr = str | list["SExpr"]
Atom = tuple[str, ...]
"""A ground atom: (predicate, argument, ...), all lower case."""
Formula = tuple
"""("atom", pred, terms) | ("=", t1, t2) | ("not", f) | ("and"|"or", fs) | ("imply", f, g)
| ("exists"|"forall", params, f) | ("when", cond, effect) | ("increase", fluent, value)."""


class PDDLError(ValueError):
    """Text that is not PDDL this reader supports, or a plan/problem that does not fit the domain."""


# -- s-expressions ------------------------------------------------------------------------------------------


def _tokens(text: str) -> list[str]:
    # `;` starts a comment; a comma separates like a space (examineObject writes `(?l - location, ?r - receptacle)`).
    return re.findall(r"[()]|[^\s(),]+", re.sub(r";[^\n]*", "", text))


def _read(tokens: list[str], i: int) -> tuple[SExpr, int]:
    if i >= len(tokens):
        raise PDDLError("unexpected end of text")
    if tokens[i] == ")":
        raise PDDLError(f"unbalanced ')' at token {i}")
    if tokens[i] != "(":
        return tokens[i], i + 1
    out: list[SExpr] = []
    i += 1
    while i < len(tokens) and tokens[i] != ")":
        item, i = _read(tokens, i)
        out.append(item)
    if i >= len(tokens):
        raise PDDLError("unbalanced '(': missing ')'")
    return out, i + 1


def parse(text: str) -> list[SExpr]:
    """Every top-level s-expression of `text`."""
    tokens, i, out = _tokens(text), 0, []
    while i < len(tokens):
        item, i = _read(tokens, i)
        out.append(item)
    return out


def parse_first(text: str) -> SExpr:
    """The first s-expression of `text`; what follows is not read (goal_library's goals end with the `)` that
    closes their problem's `define`)."""
    return _read(_tokens(text), 0)[0]


# -- domain ------------------------------------------------------------------------------------------------

Params = tuple[tuple[str, str], ...]


def typed_list(items: Sequence[SExpr], default: str = "object") -> Params:
    """`a b - t c - u d` -> ((a, t), (b, t), (c, u), (d, default)), lower case."""
    out: list[tuple[str, str]] = []
    pending: list[str] = []
    i = 0
    while i < len(items):
        item = items[i]
        if not isinstance(item, str):
            raise PDDLError(f"expected a name in a typed list, got {show(item)}")
        if item == "-":
            if i + 1 >= len(items) or not isinstance(items[i + 1], str) or not pending:
                raise PDDLError(f"bad typed list {show(list(items))}")
            out += [(name, str(items[i + 1]).lower()) for name in pending]
            pending, i = [], i + 2
            continue
        pending.append(item.lower())
        i += 1
    return tuple(out + [(name, default) for name in pending])


@dataclass(frozen=True)
class Action:
    name: str
    """As written in the file (PDDL names are case-insensitive; everything else is kept in lower case)."""
    parameters: Params
    precondition: Formula
    effect: Formula


@dataclass(frozen=True)
class Domain:
    name: str
    requirements: tuple[str, ...]
    types: dict[str, str | None]
    """type -> parent type; `object` is the root (a type declared without a parent is an `object`)."""
    predicates: dict[str, Params]
    functions: tuple[str, ...]
    actions: dict[str, Action]
    """by name as in the file, in the file's order."""

    def action(self, name: str) -> Action:
        for key, action in self.actions.items():
            if key.lower() == name.lower():
                return action
        raise PDDLError(f"the domain has no action {name!r}")

    def is_a(self, kind: str, wanted: str) -> bool:
        seen: str | None = kind
        while seen is not None:
            if seen == wanted:
                return True
            seen = self.types.get(seen, "object" if seen != "object" else None)
        return False


def _formula(expr: SExpr, domain: Domain, effect: bool = False) -> Formula:
    if isinstance(expr, str):
        raise PDDLError(f"expected a formula, got {expr!r}")
    if not expr:
        return ("and", ())
    head = str(expr[0]).lower()

    def rec(e: SExpr) -> Formula:
        return _formula(e, domain, effect)

    if head == "and" or (head == "or" and not effect):
        return (head, tuple(rec(e) for e in expr[1:]))
    if head == "not":
        return ("not", rec(expr[1]))
    if head == "imply" and not effect:
        return ("imply", rec(expr[1]), rec(expr[2]))
    if head in ("exists", "forall") and (head == "forall" or not effect):
        return (head, typed_list(expr[1]), rec(expr[2]))  # type: ignore[arg-type]
    if head == "when" and effect:
        return ("when", _formula(expr[1], domain), rec(expr[2]))
    if head == "=" and not effect:
        return ("=", str(expr[1]).lower(), str(expr[2]).lower())
    if head == "increase" and effect:
        return ("increase", show(expr[1]).lower(), show(expr[2]).lower())
    if head not in domain.predicates:
        raise PDDLError(f"unknown predicate or unsupported construct {show(expr)}")
    terms = tuple(str(t).lower() for t in expr[1:])
    if len(terms) != len(domain.predicates[head]) or not all(isinstance(t, str) for t in expr[1:]):
        raise PDDLError(f"{show(expr)}: {head} takes {len(domain.predicates[head])} arguments")
    return ("atom", head, terms)


def _section(expr: SExpr, key: str) -> list[SExpr]:
    return [item for item in expr if isinstance(item, list) and item and str(item[0]).lower() == key]


def parse_domain(text: str) -> Domain:
    exprs = parse(text)
    if len(exprs) != 1 or not isinstance(exprs[0], list) or str(exprs[0][0]).lower() != "define":
        raise PDDLError("expected one (define (domain ...) ...)")
    body = exprs[0]
    name = str(body[1][1]) if isinstance(body[1], list) and str(body[1][0]).lower() == "domain" else ""
    req = tuple(str(r).lower() for s in _section(body, ":requirements") for r in s[1:])
    types: dict[str, str | None] = {"object": None}
    for s in _section(body, ":types"):
        types.update({t: (None if t == "object" else p) for t, p in typed_list(s[1:])})
    predicates = {
        str(p[0]).lower(): typed_list(p[1:])
        for s in _section(body, ":predicates")
        for p in s[1:]
        if isinstance(p, list)
    }
    functions = tuple(str(f[0]).lower() for s in _section(body, ":functions") for f in s[1:] if isinstance(f, list))
    domain = Domain(name, req, types, predicates, functions, {})
    for s in _section(body, ":action"):
        fields = {str(s[i]).lower(): s[i + 1] for i in range(2, len(s) - 1, 2)}
        action = Action(
            str(s[1]),
            typed_list(fields.get(":parameters", [])),  # type: ignore[arg-type]
            _formula(fields.get(":precondition", []), domain),
            _formula(fields.get(":effect", []), domain, effect=True),
        )
        for _, kind in action.parameters:
            if kind not in types:
                raise PDDLError(f"{action.name}: unknown type {kind}")
        domain.actions[action.name] = action
    return domain


def domain_path() -> Path:
    return wheel_dir() / "data" / "alfred.pddl"


@lru_cache(maxsize=1)
def read_domain() -> Domain:
    """The wheel's `alfworld/data/alfred.pddl`."""
    return parse_domain(domain_path().read_text())


def show(expr: Any) -> str:
    """An s-expression (or a formula/atom of this module, with `binding` applied by the caller) as text."""
    if isinstance(expr, (list, tuple)):
        return "(" + " ".join(show(e) for e in expr) + ")"
    return str(expr)


# -- problems, states, validation -------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    objects: dict[str, str]
    """name -> type, lower case."""
    init: frozenset[Atom]
    goal: Formula | None = None


@dataclass(frozen=True)
class Step:
    """A ground action; `command` is the text command it was read from, if any."""

    action: str
    args: tuple[str, ...]
    command: str = ""

    def __str__(self) -> str:
        return show((self.action, *self.args))


@dataclass
class Validation:
    ok: bool
    states: list[frozenset[Atom]]
    """The initial state and the state after each applied step."""
    cost: float = 0.0
    goal_reached: bool | None = None
    """None when the problem has no goal, or when a step failed."""
    error: str | None = None
    failed_step: int | None = None
    """1-based index of the failed step in the plan."""
    failed_part: str | None = None
    """The ground precondition part (an atom, a negation, an `or`, ...) that does not hold."""
    goal_first_reached: int | None = None
    """After how many steps the goal first held (0: in the initial state); None if it never did."""


def ground(f: Formula, binding: dict[str, str] | None = None) -> Any:
    """The formula with `binding` applied, as nested tuples in PDDL's shape (`show` writes it as text)."""
    binding = binding or {}
    kind = f[0]
    if kind == "atom":
        return (f[1], *(binding.get(t, t) for t in f[2]))
    if kind == "=":
        return ("=", binding.get(f[1], f[1]), binding.get(f[2], f[2]))
    if kind in ("not", "imply", "when"):
        return (kind, *(ground(g, binding) for g in f[1:]))
    if kind in ("and", "or"):
        return (kind, *(ground(g, binding) for g in f[1]))
    if kind == "increase":
        return f
    inner = {k: v for k, v in binding.items() if k not in {v for v, _ in f[1]}}
    return (kind, tuple(x for v, t in f[1] for x in (v, "-", t)), ground(f[2], inner))


class _Eval:
    """Formulas of one domain over one problem's objects."""

    def __init__(self, domain: Domain, problem: Problem) -> None:
        self.domain, self.objects = domain, problem.objects
        self.of_type: dict[str, list[str]] = {}
        self.indexed: tuple[frozenset[Atom], dict[str, list[Atom]]] | None = None

    def candidates(self, kind: str) -> list[str]:
        if kind not in self.of_type:
            self.of_type[kind] = sorted(o for o, t in self.objects.items() if self.domain.is_a(t, kind))
        return self.of_type[kind]

    def term(self, t: str, binding: dict[str, str]) -> str:
        value = binding.get(t, t)
        if value.startswith("?"):
            raise PDDLError(f"free variable {t}")
        if value not in self.objects:
            raise PDDLError(f"{value} is not an object of the problem")
        return value

    def holds(self, f: Formula, state: frozenset[Atom], binding: dict[str, str]) -> bool:
        kind = f[0]
        if kind == "atom":
            return (f[1], *(self.term(t, binding) for t in f[2])) in state
        if kind == "=":
            return self.term(f[1], binding) == self.term(f[2], binding)
        if kind == "not":
            return not self.holds(f[1], state, binding)
        if kind == "and":
            return all(self.holds(g, state, binding) for g in f[1])
        if kind == "or":
            return any(self.holds(g, state, binding) for g in f[1])
        if kind == "imply":
            return not self.holds(f[1], state, binding) or self.holds(f[2], state, binding)
        if kind == "exists":
            return next(self.witnesses(f, state, binding), None) is not None
        if kind == "forall":
            return all(self.holds(f[2], state, b) for b in self.bindings(f[1], binding))
        raise PDDLError(f"{kind} is not a condition")

    def bindings(self, params: Params, binding: dict[str, str]) -> Iterator[dict[str, str]]:
        names = [v for v, _ in params]
        for values in itertools.product(*(self.candidates(t) for _, t in params)):
            yield {**binding, **dict(zip(names, values))}

    def witnesses(self, f: Formula, state: frozenset[Atom], binding: dict[str, str]) -> Iterator[dict[str, str]]:
        """Bindings that satisfy an `exists`: nested exists are merged and the variables bound one at a time,
        each conjunct checked as soon as its variables are bound, and a variable's values taken from the state's
        atoms of a conjunct that binds it where there is one (ALFWorld's goals quantify over all objects)."""
        params, body = list(f[1]), f[2]
        while body[0] == "exists":
            params, body = params + list(body[1]), body[2]
        parts = body[1] if body[0] == "and" else (body,)
        scoped = {v for v, _ in params}
        pending = [(p, _free(p) & scoped) for p in parts]

        def values(var: str, kind: str, bound: dict[str, str], now: frozenset[str]) -> Iterable[str]:
            typed = self.candidates(kind)
            for p, free in pending:
                if p[0] == "atom" and var in free and free <= now:
                    pos = p[2].index(var)
                    known = [(k, bound.get(t, t)) for k, t in enumerate(p[2]) if t != var]
                    found = {a[pos + 1] for a in self.atoms(state, p[1]) if all(a[k + 1] == t for k, t in known)}
                    return [v for v in typed if v in found]
            return typed

        def search(i: int, bound: dict[str, str], done: frozenset[str]) -> Iterator[dict[str, str]]:
            if i == len(params):
                yield bound
                return
            var, kind = params[i]
            now = done | {var}
            checks = [p for p, free in pending if free <= now and not free <= done]
            for value in values(var, kind, bound, now):
                b = {**bound, var: value}
                if all(self.holds(p, state, b) for p in checks):
                    yield from search(i + 1, b, now)

        ground_parts = [p for p, free in pending if not free]
        if all(self.holds(p, state, binding) for p in ground_parts):
            yield from search(0, dict(binding), frozenset())

    def atoms(self, state: frozenset[Atom], predicate: str) -> list[Atom]:
        """The state's atoms of a predicate (indexed once per state)."""
        if self.indexed is None or self.indexed[0] is not state:
            index: dict[str, list[Atom]] = {}
            for atom in state:
                index.setdefault(atom[0], []).append(atom)
            self.indexed = (state, index)
        return self.indexed[1].get(predicate, [])

    def first_failure(self, f: Formula, state: frozenset[Atom], binding: dict[str, str]) -> Any:
        """The ground part of a false formula to blame: the first false conjunct of an `and`, recursively."""
        if f[0] == "and":
            for g in f[1]:
                if not self.holds(g, state, binding):
                    return self.first_failure(g, state, binding)
        return ground(f, binding)

    def effects(self, f: Formula, state: frozenset[Atom], binding: dict[str, str], out: dict[str, Any]) -> None:
        kind = f[0]
        if kind == "and":
            for g in f[1]:
                self.effects(g, state, binding, out)
        elif kind == "atom":
            out["add"].add((f[1], *(self.term(t, binding) for t in f[2])))
        elif kind == "not" and f[1][0] == "atom":
            out["del"].add((f[1][1], *(self.term(t, binding) for t in f[1][2])))
        elif kind == "when":
            if self.holds(f[1], state, binding):
                self.effects(f[2], state, binding, out)
        elif kind == "forall":
            for b in self.bindings(f[1], binding):
                self.effects(f[2], state, b, out)
        elif kind == "increase" and f[1] == "(total-cost)":
            try:
                out["cost"] += float(f[2])
            except ValueError:
                raise PDDLError(f"only constant costs are supported: (increase {f[1]} {f[2]})") from None
        else:
            raise PDDLError(f"unsupported effect {show(ground(f, binding))}")


@cache
def _free(f: Formula) -> frozenset[str]:
    """Variables of a formula not bound inside it."""
    kind = f[0]
    if kind == "atom":
        return frozenset(t for t in f[2] if t.startswith("?"))
    if kind == "=":
        return frozenset(t for t in f[1:] if t.startswith("?"))
    if kind in ("not",):
        return _free(f[1])
    if kind in ("and", "or"):
        return frozenset().union(*(_free(g) for g in f[1]))
    if kind in ("imply", "when"):
        return _free(f[1]) | _free(f[2])
    if kind in ("exists", "forall"):
        return _free(f[2]) - {v for v, _ in f[1]}
    return frozenset()


def holds(domain: Domain, problem: Problem, formula: Formula, state: frozenset[Atom]) -> bool:
    return _Eval(domain, problem).holds(formula, state, {})


def validate(domain: Domain, problem: Problem, plan: Iterable[Step]) -> Validation:
    """Apply `plan` from `problem.init`, step by step, as VAL does; stop at the first failure."""
    ev = _Eval(domain, problem)
    state = problem.init
    result = Validation(ok=False, states=[state])

    def fail(index: int, message: str, part: str | None = None) -> Validation:
        result.error, result.failed_step, result.failed_part = message, index, part
        return result

    def goal_check() -> None:
        if problem.goal is not None and result.goal_first_reached is None and ev.holds(problem.goal, state, {}):
            result.goal_first_reached = len(result.states) - 1

    goal_check()
    for index, step in enumerate(plan, 1):
        where = f"step {index} {step}" + (f" (`{step.command}`)" if step.command else "")
        try:
            action = domain.action(step.action)
        except PDDLError as e:
            return fail(index, f"{where}: {e}")
        params = action.parameters
        if len(step.args) != len(params):
            wanted = " ".join(v for v, _ in params)
            return fail(index, f"{where}: {action.name} takes {len(params)} arguments ({wanted}), got {len(step.args)}")
        for (var, kind), arg in zip(params, step.args):
            if arg not in problem.objects or not domain.is_a(problem.objects[arg], kind):
                what = f"a {problem.objects[arg]}" if arg in problem.objects else "not an object of the problem"
                return fail(index, f"{where}: argument {var} must be a {kind}; {arg} is {what}")
        binding = {var: arg for (var, _), arg in zip(params, step.args)}
        if not ev.holds(action.precondition, state, binding):
            part = show(ev.first_failure(action.precondition, state, binding))
            return fail(index, f"{where}: precondition {part} does not hold", part)
        out: dict[str, Any] = {"add": set(), "del": set(), "cost": 0.0}
        ev.effects(action.effect, state, binding, out)
        state = (state - out["del"]) | out["add"]
        result.cost += out["cost"]
        result.states.append(state)
        goal_check()
    if problem.goal is not None:
        result.goal_reached = ev.holds(problem.goal, state, {})
        if not result.goal_reached:
            result.error = f"the goal does not hold after the plan: {show(ground(problem.goal))}"
            return result
    result.ok = True
    return result


# -- ALFWorld's grammar and goals ----------------------------------------------------------------------------


def grammar_path() -> Path:
    return wheel_dir() / "data" / "alfred.twl2"


@lru_cache(maxsize=1)
def command_templates() -> list[tuple[str, re.Pattern[str], tuple[str, ...]]]:
    """(action, pattern, template variables) per action of the wheel's grammar that the domain defines.

    `template :: "take {o} from {r}"` reads `take (?P<o>.+) from (?P<r>.+)`; GotoLocation's `go to
    [{r.name | receptacleatlocation(r:receptacle, lend:location)}]` reads `go to (?P<r>.+)`.
    """
    domain, out = read_domain(), []
    text = grammar_path().read_text()
    for name, template in re.findall(r'action\s+(\w+)\s*\{\s*template\s*::\s*"([^"]*)"', text):
        if name.lower() not in {a.lower() for a in domain.actions}:
            continue  # commented out in alfred.pddl (receptacle objects)
        template = re.sub(r"\[\{(\w+)\.name \|[^\]]*\}\]", r"{\1}", template)
        names = tuple(re.findall(r"\{(\w+)\}", template))
        pattern = re.escape(template)
        for var in names:
            pattern = pattern.replace(re.escape("{" + var + "}"), f"(?P<{var}>.+?)")
        out.append((domain.action(name).name, re.compile(pattern), names))
    return out


@lru_cache(maxsize=1)
def goal_library() -> dict[str, dict[str, Any]]:
    """The wheel's `alfworld/gen/goal_library.py` (a dict of goal formulas; stdlib only)."""
    return runpy.run_path(str(wheel_dir() / "gen" / "goal_library.py"))["gdict"]


def fix_pddl_chars(text: str) -> str:
    """ALFWorld's PlannedGameState.fix_pddl_str_chars: goal_library writes `#` for PDDL's `-`."""
    table = {"-": "_minus_", "#": "-", "|": "_bar_", "+": "_plus_", ".": "_dot_", ",": "_comma_"}
    return "".join(table.get(ch, ch) for ch in text)


def parse_goal(text: str, domain: Domain) -> Formula:
    expr = parse_first(text)
    if not isinstance(expr, list) or len(expr) != 2 or str(expr[0]).lower() != ":goal":
        raise PDDLError(f"expected (:goal ...), got {show(expr)[:80]}")
    return _formula(expr[1], domain)


# -- our games as ALFWorld PDDL problems ---------------------------------------------------------------------

AGENT, START = "agent1", "loc_start"


def pddl_name(name: str) -> str:
    """`lettuce 1` -> `lettuce_1` (receptacles, objects and lamps of a game)."""
    return name.strip().lower().replace(" ", "_")


def type_name(kind: str) -> str:
    """`CounterTop` -> `countertoptype`, ALFWorld's type objects (`CounterTopType # rtype`)."""
    return f"{kind}Type".lower()


def location(receptacle: str) -> str:
    return f"loc_{pddl_name(receptacle)}"


@lru_cache(maxsize=1)
def type_objects() -> tuple[dict[str, str], frozenset[Atom]]:
    """ALFWorld's type objects (as PlannedGameState declares them: receptacle classes but the movable ones are
    rtypes, every other object class an otype) and (canContain rtype otype) from constants'
    VAL_RECEPTACLE_OBJECTS (ALFWorld's game files state canContain; the wheel's problem writer does not)."""
    c = constants()
    rtypes = set(c["RECEPTACLES"]) - set(c["MOVABLE_RECEPTACLES"])
    otypes = set(c["OBJECTS_SET"]) - rtypes
    objects = {type_name(t): "otype" for t in otypes} | {type_name(t): "rtype" for t in rtypes}
    contain = frozenset(
        ("cancontain", type_name(r), type_name(o))
        for r, held in c["VAL_RECEPTACLE_OBJECTS"].items()
        if r in rtypes
        for o in held
        if o in otypes
    )
    return objects, contain


def game_problem(game: dict[str, Any]) -> Problem:
    """Objects, initial state and goal of a stored game, in the wheel's domain.

    Like ALFWorld's problems (PlannedGameState.state_to_pddl): receptacle types, object types, openable,
    cleanable/heatable/coolable from constants' VAL_ACTION_OBJECTS, the toggleable lamp (not pickupable, not
    on), (isCool o) for objects that start in a fridge (ALFWorld counts those as cooled), nothing opened, the
    agent at its own start location. Also stated, as in ALFWorld's game files: (pickupable o) for every
    object placed in a receptacle, canContain. Our games put every object and lamp in a receptacle."""
    c = constants()
    types, contain = type_objects()
    objects: dict[str, str] = {AGENT: "agent", START: "location", **types}
    init: set[Atom] = {("atlocation", AGENT, START)} | set(contain)
    rtype = {r["name"]: r["type"] for r in game["receptacles"]}
    for r in game["receptacles"]:
        name = pddl_name(r["name"])
        objects[name], objects[location(r["name"])] = "receptacle", "location"
        init |= {("receptacleatlocation", name, location(r["name"])), ("receptacletype", name, type_name(r["type"]))}
        if r["openable"]:
            init.add(("openable", name))
    action_sets = {"cleanable": "Cleanable", "heatable": "Heatable", "coolable": "Coolable"}
    for o in game["objects"] + game.get("lamps", []):
        name, recep = pddl_name(o["name"]), pddl_name(o["location"])
        objects[name] = "object"
        init |= {("objecttype", name, type_name(o["type"])), ("inreceptacle", name, recep)}
        init.add(("objectatlocation", name, location(o["location"])))
        if o["type"] in c["VAL_ACTION_OBJECTS"]["Toggleable"]:
            init.add(("toggleable", name))
        else:
            init.add(("pickupable", name))
        init |= {(pred, name) for pred, kind in action_sets.items() if o["type"] in c["VAL_ACTION_OBJECTS"][kind]}
        if rtype.get(o["location"]) == "Fridge":
            init.add(("iscool", name))
    unknown = {a for atom in init for a in atom[1:] if a not in objects}
    if unknown:
        raise PDDLError(f"{game.get('id')}: types ALFWorld does not declare: {sorted(unknown)}")
    return Problem(objects, frozenset(init), goal_formula(game))


def goal_formula(game: dict[str, Any]) -> Formula:
    """The wheel's goal_library formula of the game's task type, filled in as TaskGameState.get_goal_pddl does
    (obj, recep, toggle: class names; mrecep unused by the six task types)."""
    goal = game["goal"]
    toggle = game["lamps"][0]["type"] if game.get("lamps") else ""
    text = goal_library()[game["task_type"]]["pddl"].format(
        obj=goal["object"], recep=goal["target"], toggle=toggle, mrecep=""
    )
    return parse_goal(fix_pddl_chars(text).lower(), read_domain())


def command_step(game: dict[str, Any], command: str, at: str) -> Step | None:
    """The ground action of a text command when the agent is at location `at`; None for `think: ...`.

    The grammar names the receptacle and/or object; the other parameters are: ?a the agent; ?lStart the
    agent's location; ?lEnd and ?l the location of the named receptacle (for `look`, the agent's location);
    ToggleObject's ?r the receptacle the object was placed in (lamps never move: they are not pickupable);
    PutObject's ?ot and ?rt the named object's and receptacle's type objects."""
    text = " ".join(command.strip().lower().rstrip(".").split())
    if text.startswith("think:"):
        return None
    kinds = {pddl_name(r["name"]): r["type"] for r in game["receptacles"]}
    things = {pddl_name(o["name"]): o for o in game["objects"] + game.get("lamps", [])}
    domain = read_domain()
    for name, pattern, names in command_templates():
        match = pattern.fullmatch(text)
        if not match:
            continue
        action = domain.action(name)
        named = {f"?{v}": pddl_name(match[v]) for v in names}
        declared = dict(action.parameters)
        if not all(
            (n in kinds if declared[v] == "receptacle" else n in things) for v, n in named.items() if v in declared
        ):
            continue  # `examine X` reads examineReceptacle or examineObject by what X is
        thing = things[named["?o"]] if "?o" in named else None
        recep = named.get("?r") or (pddl_name(thing["location"]) if thing else None)
        fill = {
            "?a": AGENT,
            "?lstart": at,
            "?lend": location(recep) if recep else None,
            "?l": location(recep) if recep else at,
            "?r": recep,
            "?ot": type_name(thing["type"]) if thing else None,
            "?rt": type_name(kinds[recep]) if recep else None,
        }
        args = tuple(named.get(v) or fill.get(v) for v, _ in action.parameters)
        if None in args:
            raise PDDLError(f"`{command}`: cannot fill {action.name}'s parameters {show(action.parameters)}")
        return Step(action.name, args, command)
    raise PDDLError(f"`{command}` matches no command of ALFWorld's grammar for this game")


def game_plan(game: dict[str, Any], commands: Sequence[str] | None = None) -> list[Step]:
    """Ground actions of `commands` (default: the stored walkthrough); `go to` moves the agent's location."""
    steps, at = [], START
    for command in game["walkthrough"] if commands is None else commands:
        step = command_step(game, command, at)
        if step is None:
            continue
        if step.action == "GotoLocation":
            at = step.args[2]
        steps.append(step)
    return steps


def check_walkthrough(game: dict[str, Any]) -> Validation:
    """A game's stored walkthrough validated against the wheel's domain, from the game's problem to its goal."""
    return validate(read_domain(), game_problem(game), game_plan(game))
