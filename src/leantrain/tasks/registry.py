"""The task registry: every workload leantrain knows, by its `--task` name and aliases.

`register` adds one: a `Task` subclass (its `name` and `aliases` say how it is called), or, for a built-in that
should not be imported until a run needs it, its "module:Class" path with the same names. The config's `--task`
choices, `leantrain evaluate`/`predict`, the planner and the model-type inference all read this table, so a task
registered here is known everywhere; nothing else needs editing. Reading the names imports no task module (and so
no torch): `leantrain --help` stays fast.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from leantrain.errors import ConfigError

if TYPE_CHECKING:
    from leantrain.tasks.base import Task


@dataclass
class TaskEntry:
    """One registered task: its names and where its class is."""

    name: str
    aliases: tuple[str, ...]
    #: the class, or "module:Class" until it is first needed
    target: Any
    #: alias -> the config values that spelling implies where the config leaves them unset (`--task translation`:
    #: BLEU and chrF, where the task's own default is ROUGE)
    implies: dict[str, dict[str, Any]] = field(default_factory=dict)

    def load(self) -> type[Task]:
        if isinstance(self.target, str):
            module, _, attr = self.target.partition(":")
            self.target = getattr(importlib.import_module(module), attr)
            if self.target.name != self.name:  # the class's own name must be the one it was registered under
                found = f"task {self.target.__name__} is named {self.target.name!r}"
                raise ConfigError(f"{found}, registered as {self.name!r}")
        return self.target


#: `--task` name -> entry, in registration order (the order of `--help` and of model-type inference)
TASKS: dict[str, TaskEntry] = {}


def register(
    task: type[Task] | str,
    *,
    name: str | None = None,
    aliases: Sequence[str] = (),
    implies: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Make a task known by its name and aliases: a `Task` subclass (`leantrain.tasks.register(MyTask)`: its `name`
    and `aliases` class attributes), or a "module:Class" path with `name` and `aliases`, imported when first used.
    `implies`: alias -> config values that spelling sets where the config leaves them unset. Registering a name
    again replaces the task it named."""
    if isinstance(task, str):
        if name is None:
            raise ConfigError(f"register({task!r}): a task given by its path needs name=")
        entry = TaskEntry(name, tuple(aliases), task, dict(implies or {}))
    else:
        entry = TaskEntry(task.name, tuple(aliases) or tuple(getattr(task, "aliases", ())), task, dict(implies or {}))
    taken = {a: e.name for e in TASKS.values() for a in (e.name, *e.aliases) if e.name != entry.name}
    for spelling in (entry.name, *entry.aliases):
        if spelling in taken:
            raise ConfigError(f"task name {spelling!r} is taken by the {taken[spelling]} task")
    TASKS[entry.name] = entry


def names() -> tuple[str, ...]:
    """The registered task names, without aliases."""
    return tuple(TASKS)


def spellings() -> tuple[str, ...]:
    """Every name `--task` accepts: the names and their aliases."""
    return tuple(s for e in TASKS.values() for s in (e.name, *e.aliases))


def canonical(spelling: str) -> str:
    """The task a `--task` spelling names, refused in one line when unknown. "package.module:Class" names a task
    of your own: the module is imported and the class registered."""
    for e in TASKS.values():
        if spelling == e.name or spelling in e.aliases:
            return e.name
    if ":" in spelling:
        return _import_task(spelling)
    raise ConfigError(
        f"--task must be one of {', '.join(spellings())} (or package.module:Class for a task of your own); "
        f"got '{spelling}'"
    )


def implied(spelling: str) -> dict[str, Any]:
    """The config values a `--task` spelling implies (an alias's `implies`), where the config leaves them unset."""
    return next((dict(e.implies.get(spelling, {})) for e in TASKS.values() if spelling in e.aliases), {})


def _import_task(path: str) -> str:
    from leantrain.tasks.base import Task

    module, _, attr = path.partition(":")
    try:
        found = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"--task {path}: cannot import it ({type(exc).__name__}: {exc})") from None
    if not (isinstance(found, type) and issubclass(found, Task)):
        raise ConfigError(f"--task {path}: not a leantrain.tasks.Task subclass")
    register(found)
    return found.name


def recorded_name(task: type[Task]) -> str:
    """How a run records its task (config.yaml) so that another process finds it again: a built-in's name, else
    the task's "package.module:Class" path, which `canonical` imports."""
    return task.name if task.__module__.startswith("leantrain.") else f"{task.__module__}:{task.__qualname__}"


def task_class(spelling: str) -> type[Task]:
    return TASKS[canonical(spelling)].load()


def classes() -> list[type[Task]]:
    """Every registered task's class, in registration order (imports them)."""
    return [e.load() for e in TASKS.values()]
