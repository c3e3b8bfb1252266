"""OpenAI tool calling on the chat route: the request's `tools`, `tool_choice` and
`parallel_tool_calls`, the `tool_calls` of assistant messages in the history, and `ToolSetup`,
what the route does with them.

`tool_choice`:
- "auto" (the default with tools): the tools are rendered into the prompt; the output is a tool
  call if the model writes one in its family's format (handler/api/tool_parsers), else content.
- "required" / a named function: rendered the same, and the output is constrained to calls
  (to the named function only) whose arguments validate against the function's `parameters`.
- "none": the tools are NOT rendered and the output is never parsed as calls. vLLM renders
  them unless told not to; we do not, because a tool-aware template then tells the model to
  answer with a call (Llama 3.1's: "respond with a JSON for a function call"), the opposite of
  "none", and because a client that always sends its tools (LangChain, agents) must still get
  an answer from a model whose template cannot render tools.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, StrictBool, StrictStr

from handler.api.common import Lenient
from handler.api.tool_parsers import FunctionSpec, ToolParser, parser_for
from handler.errors import InvalidRequest
from handler.request import Constraint


class FunctionDefinition(Lenient):
    name: StrictStr = Field(min_length=1)
    description: StrictStr | None = None
    # Checked by `tool_setup` (required, a JSON Schema object), whose 400 names
    # tools[i].function.parameters as OpenAI spells the field.
    parameters: Any = None
    strict: StrictBool | None = None  # accepted; the constraint (required / named) always applies the schema


class Tool(Lenient):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(Lenient):
    name: StrictStr


class NamedToolChoice(Lenient):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(Lenient):
    name: StrictStr
    arguments: StrictStr  # a JSON object as text, as OpenAI sends it back


class MessageToolCall(Lenient):
    """One entry of an assistant message's `tool_calls` in the history."""

    id: StrictStr | None = None
    type: Literal["function"] = "function"
    function: FunctionCall

    def template_dict(self) -> dict[str, Any]:
        """As transformers' chat templates take it: `arguments` a dict (Llama 3.1's writes
        `arguments | tojson`; a string would come out quoted), kept as text when it is not a
        JSON object."""
        try:
            arguments: Any = json.loads(self.function.arguments)
        except ValueError:
            arguments = self.function.arguments
        if not isinstance(arguments, dict):
            arguments = self.function.arguments
        out: dict[str, Any] = {"type": "function", "function": {"name": self.function.name, "arguments": arguments}}
        if self.id is not None:
            out["id"] = self.id
        return out


@dataclass(frozen=True)
class ToolSetup:
    """What a request's tool fields ask for."""

    tools: tuple[Tool, ...]
    choice: Literal["none", "auto", "required", "function"]
    parallel: bool
    named: str | None = None  # choice "function": the function it must call

    @property
    def parses_calls(self) -> bool:
        return self.choice != "none"

    @property
    def forced(self) -> bool:
        """The output must be a call: it is constrained."""
        return self.choice in ("required", "function")

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools as chat templates take them (OpenAI's shape, as transformers documents);
        None with choice "none" (not rendered, see the module docstring)."""
        if self.choice == "none":
            return None
        out = []
        for tool in self.tools:
            function: dict[str, Any] = {"name": tool.function.name}
            if tool.function.description is not None:
                function["description"] = tool.function.description
            function["parameters"] = tool.function.parameters
            out.append({"type": "function", "function": function})
        return out

    def parser(self, name: str) -> ToolParser:
        """A fresh parser of the named family for this request's tools."""
        return parser_for(name)([t.function.name for t in self.tools], max_calls=None if self.parallel else 1)

    def constraint(self, parser_name: str) -> Constraint | None:
        """With "required" or a named function, the output's constraint in the parser's own call
        format; None otherwise."""
        if not self.forced:
            return None
        functions = [
            FunctionSpec(t.function.name, t.function.parameters)
            for t in self.tools
            if self.named is None or t.function.name == self.named
        ]
        return parser_for(parser_name).constraint(functions, parallel=self.parallel and self.named is None)


def tool_setup(tools: list[Tool] | None, tool_choice: ToolChoice | None, parallel: bool | None) -> ToolSetup | None:
    """The request's tool fields checked (a 400 naming the field) into a `ToolSetup`; None when the
    request offers no tools."""
    if not tools:
        if tool_choice is not None and tool_choice != "none":
            raise InvalidRequest("'tool_choice' is only allowed when 'tools' are specified", "tool_choice")
        return None
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        _check_parameters(tool.function.parameters, f"tools[{i}].function.parameters")
        if tool.function.name in seen:
            raise InvalidRequest(
                f"tools[{i}].function.name: the function name '{tool.function.name}' is used twice",
                f"tools[{i}].function.name",
            )
        seen.add(tool.function.name)
    parallel = True if parallel is None else parallel
    if isinstance(tool_choice, NamedToolChoice):
        name = tool_choice.function.name
        if name not in seen:
            raise InvalidRequest(f"tool_choice names the function '{name}', which is not in 'tools'", "tool_choice")
        return ToolSetup(tuple(tools), "function", parallel, name)
    return ToolSetup(tuple(tools), tool_choice or "auto", parallel)


def _check_parameters(parameters: Any, param: str) -> None:
    if parameters is None:
        raise InvalidRequest(
            f"'{param}' is required: a JSON Schema of the function's arguments "
            '({"type": "object", "properties": {}} for none)',
            param,
        )
    if not isinstance(parameters, dict):
        raise InvalidRequest(f"'{param}' must be a JSON Schema object, got {type(parameters).__name__}", param)
    kind = parameters.get("type", "object")
    if kind != "object":
        raise InvalidRequest(f"'{param}' must describe an object (type object), got type {kind!r}", param)
