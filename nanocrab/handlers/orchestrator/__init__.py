"""The orchestrator: the run state machine (:func:`decide`) and its reactor."""

from nanocrab.handlers.orchestrator.commands import COMMANDS, Command, command
from nanocrab.handlers.orchestrator.decide import decide
from nanocrab.handlers.orchestrator.reactor import Orchestrator
from nanocrab.handlers.orchestrator.spawn import NATIVE_TOOLS, SpawnTool

__all__ = ["COMMANDS", "NATIVE_TOOLS", "Command", "Orchestrator", "SpawnTool", "command", "decide"]
