"""Tool calls where the SDK renders the chat template (in process): the call format a template uses, the forced
call's constraint, calls read from text (and stream pieces), and the refusals (inference._core.tool_formats)."""

from __future__ import annotations

import dataclasses
import itertools
import json
from typing import Any

import pytest

from inference import GenerationResult
from inference._core.tool_formats import HERMES, MISTRAL, NO_TOOLS, ToolCallStream, ToolPlan, tool_format
from inference._core.validation import GenerationRequest
from inference.exceptions import InvalidRequestError, UnsupportedOperationError

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}

HERMES_TEMPLATE = "{% if tools %}{% for tool in tools %}{{ tool | tojson }}{% endfor %}<tool_call>{% endif %}"
LLAMA3_TEMPLATE = '{% if tools %}Respond as {"name": function name, "parameters": dict}{% endif %}'
MISTRAL_TEMPLATE = "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}{% endif %}[TOOL_CALLS]"
CHATML = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def request(**options: Any) -> GenerationRequest:
    return GenerationRequest.from_arguments(provider="p", prompt="Weather in Paris?", model="m", **options)


def result(text: str, finish_reason: str = "stop") -> GenerationResult:
    return GenerationResult(text=text, model="m", adapter_id=None, token_count=1, finish_reason=finish_reason)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (None, NO_TOOLS),
        (CHATML, NO_TOOLS),
        (HERMES_TEMPLATE, HERMES),
        (MISTRAL_TEMPLATE, MISTRAL),
    ],
)
def test_the_format_is_read_from_the_template(template: str | None, expected: object) -> None:
    assert tool_format(template) == expected


def test_a_template_that_reads_tools_without_a_marker_takes_json_objects_with_its_key() -> None:
    assert tool_format(LLAMA3_TEMPLATE).name == "json"
    assert tool_format(LLAMA3_TEMPLATE).arguments_key == "parameters"
    assert tool_format("{% if tools %}{{ tools }}{% endif %}").arguments_key == "arguments"


def test_hermes_calls_are_read_with_the_text_around_them() -> None:
    plan = ToolPlan.for_request(request(tools=[WEATHER, TIME]), HERMES_TEMPLATE, model="m", provider="p")
    text = (
        'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    )
    read = plan.read(result(text))
    assert read.text == "Let me look."
    assert read.finish_reason == "tool_calls"
    assert [(call.name, call.arguments, call.error) for call in read.tool_calls or ()] == [
        ("get_weather", {"city": "Paris"}, None),
        ("get_time", {}, None),
    ]
    assert len({call.id for call in read.tool_calls or ()}) == 2


def test_a_call_that_does_not_parse_is_reported_not_dropped() -> None:
    plan = ToolPlan.for_request(request(tools=[WEATHER]), HERMES_TEMPLATE, model="m", provider="p")
    read = plan.read(result('<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>'))
    (call,) = read.tool_calls or ()
    assert call.name == "get_weather"
    assert call.error is not None and "not a JSON object" in call.error
    assert call.raw_arguments.startswith('{"name": "get_weather"')


def test_a_call_cut_by_max_tokens_says_so_and_keeps_the_length_reason() -> None:
    plan = ToolPlan.for_request(request(tools=[WEATHER]), HERMES_TEMPLATE, model="m", provider="p")
    read = plan.read(result('<tool_call>{"name": "get_weather", "argu', "length"))
    (call,) = read.tool_calls or ()
    assert "raise max_tokens" in (call.error or "")
    assert read.finish_reason == "length"
    # cut inside its arguments: raw_arguments hold them as written (they held the whole call object, and
    # as_message() sent that back as the call's arguments)
    read = plan.read(result('<tool_call>{"name": "get_weather", "arguments": {"city": "Par', "length"))
    (call,) = read.tool_calls or ()
    assert (call.name, call.raw_arguments, read.finish_reason) == ("get_weather", '{"city": "Par', "length")
    assert "the arguments the model wrote before the cut" in (call.error or "")


@pytest.mark.parametrize(
    ("template", "answer"),
    [
        (LLAMA3_TEMPLATE, '{"name": "get_weather", "parameters": {"city": "Par'),
        (MISTRAL_TEMPLATE, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Par'),
    ],
    ids=["json", "mistral"],
)
def test_a_call_cut_in_a_format_without_a_closing_marker_keeps_its_arguments_as_written(
    template: str, answer: str
) -> None:
    """These formats run a call to the answer's end: only finish_reason says it was cut (the whole call object was
    raw_arguments, and the error did not say max_tokens)."""
    plan = ToolPlan.for_request(request(tools=[WEATHER]), template, model="m", provider="p")
    read = plan.read(result(answer, "length"))
    (call,) = read.tool_calls or ()
    assert (call.name, call.raw_arguments, read.finish_reason) == ("get_weather", '{"city": "Par', "length")
    assert "raise max_tokens" in (call.error or "")



def test_a_call_without_a_readable_name_is_named_after_the_one_tool_it_could_call_and_goes_back_to_the_model() -> None:
    forced = {"type": "function", "function": {"name": "get_time"}}
    cases = [  # (the request's tools and choice, the answer, the name read)
        ({"tools": [WEATHER, TIME], "tool_choice": forced}, '{"', "get_time"),  # forced, cut after two tokens
        ({"tools": [WEATHER]}, '<tool_call>get_weather(city="Paris")</tool_call>', "get_weather"),  # the only tool
        ({"tools": [WEATHER, TIME]}, "<tool_call>get_weather(city=Paris)</tool_call>", ""),  # nothing says which
    ]
    for options, text, name in cases:
        plan = ToolPlan.for_request(request(**options), HERMES_TEMPLATE, model="m", provider="p")
        (call,) = plan.read(result(text, "length")).tool_calls or ()
        assert (call.name, call.arguments) == (name, {}) and "not a JSON object" in (call.error or "")
        turn = result("", "tool_calls")
        messages = [{"role": "user", "content": "hi"}, dataclasses.replace(turn, tool_calls=(call,)).as_message(),
                    call.answer(f"error: {call.error}")]
        def next_turn(messages: list[Any] = messages, options: dict[str, Any] = options) -> GenerationRequest:
            return GenerationRequest.from_arguments(provider="p", prompt=messages, model="m", tools=options["tools"])

        if name:  # the loop of docs/tools.md carries on
            assert next_turn().messages[1]["tool_calls"][0]["function"]["name"] == name
        else:
            with pytest.raises(InvalidRequestError, match="answer its error in a user message instead"):
                next_turn()

def test_arguments_that_do_not_validate_are_kept_with_the_error() -> None:
    plan = ToolPlan.for_request(request(tools=[WEATHER]), HERMES_TEMPLATE, model="m", provider="p")
    read = plan.read(result('<tool_call>{"name": "get_weather", "arguments": {"town": "Paris"}}</tool_call>'))
    (call,) = read.tool_calls or ()
    assert call.arguments == {"town": "Paris"}
    assert "'city' is a required property" in (call.error or "")


@pytest.mark.parametrize(
    ("template", "text"),
    [
        (HERMES_TEMPLATE, '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "city": "Rome"}}'
                          "</tool_call>"),
        (LLAMA3_TEMPLATE, '{"name": "get_weather", "parameters": {"city": "Paris", "city": "Rome"}}'),
        (MISTRAL_TEMPLATE, '[TOOL_CALLS][{"name": "get_time", "arguments": {}}, '
                           '{"name": "get_weather", "arguments": {"city": "Paris", "city": "Rome"}}]'),
        (HERMES_TEMPLATE, '<tool_call>{"name": "get_weather", "arguments": {"city": NaN}}</tool_call>'),
    ],
    ids=["hermes-key-twice", "json-key-twice", "mistral-key-twice", "hermes-NaN"],
)
def test_a_call_that_is_not_strict_json_is_reported_with_its_error(template: str, text: str) -> None:
    """Reviewed defect: a key written twice was read as its last value (``{"city": "Rome"}``), without an error."""
    plan = ToolPlan.for_request(request(tools=[WEATHER, TIME]), template, model="m", provider="p")
    read = plan.read(result(text))
    call = (read.tool_calls or ())[-1]
    assert call.name == "get_weather" and call.arguments == {}
    why = "NaN is not JSON" if "NaN" in text else "an object holds the key 'city' twice"
    assert why in (call.error or "")


def test_text_without_a_call_is_the_answer() -> None:
    plan = ToolPlan.for_request(request(tools=[WEATHER]), HERMES_TEMPLATE, model="m", provider="p")
    read = plan.read(result("It is sunny."))
    assert read.tool_calls is None and read.text == "It is sunny." and read.finish_reason == "stop"


def test_llama3_json_calls_and_plain_json_answers() -> None:
    plan = ToolPlan.for_request(request(tools=[WEATHER]), LLAMA3_TEMPLATE, model="m", provider="p")
    read = plan.read(result('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}'))
    assert read.text == "" and [call.arguments for call in read.tool_calls or ()] == [{"city": "Oslo"}]
    assert plan.read(result('{"answer": 4}')).tool_calls is None  # JSON, but no call


def test_mistral_calls_are_a_list_after_the_marker() -> None:
    plan = ToolPlan.for_request(request(tools=[WEATHER, TIME]), MISTRAL_TEMPLATE, model="m", provider="p")
    read = plan.read(result('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}, '
                            '{"name": "get_time", "arguments": {}}]'))
    assert [call.name for call in read.tool_calls or ()] == ["get_weather", "get_time"]


def test_a_forced_call_starts_the_answer_with_the_marker_and_is_constrained_to_the_tool() -> None:
    plan = ToolPlan.for_request(
        request(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_weather"}}),
        HERMES_TEMPLATE, model="m", provider="p",
    )
    sent = plan.backend_request(request(tools=[WEATHER, TIME]))
    assert sent.answer_prefix == "<tool_call>"
    assert sent.json_schema == {
        "type": "object",
        "properties": {"name": {"const": "get_weather"}, "arguments": WEATHER["function"]["parameters"]},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
    read = plan.read(result('{"name": "get_weather", "arguments": {"city": "Paris"}}'))
    assert [(call.name, call.arguments) for call in read.tool_calls or ()] == [("get_weather", {"city": "Paris"})]
    assert read.finish_reason == "tool_calls"


def test_required_with_several_tools_lets_the_call_be_any_of_them() -> None:
    plan = ToolPlan.for_request(request(tools=[WEATHER, TIME], tool_choice="required"), LLAMA3_TEMPLATE,
                                model="m", provider="p")
    schema = plan.backend_request(request()).json_schema or {}
    assert [option["properties"]["name"] for option in schema["anyOf"]] == [{"const": "get_weather"},
                                                                            {"const": "get_time"}]
    assert all("parameters" in option["properties"] for option in schema["anyOf"])


def test_a_template_without_tool_support_is_refused_for_auto_but_takes_a_forced_call() -> None:
    with pytest.raises(UnsupportedOperationError, match="chat template of tiny has no tool support"):
        ToolPlan.for_request(request(tools=[WEATHER]), CHATML, model="tiny", provider="p")
    plan = ToolPlan.for_request(request(tools=[WEATHER], tool_choice="required"), CHATML, model="tiny",
                                provider="p")
    sent = plan.backend_request(request(tools=[WEATHER], tool_choice="required"))
    assert sent.answer_prefix == "" and sent.tools == ()  # the template cannot show them
    read = plan.read(result('{"name": "get_weather", "arguments": {"city": "Paris"}}'))
    assert [call.arguments for call in read.tool_calls or ()] == [{"city": "Paris"}]


def test_none_renders_no_tools_and_reads_no_calls() -> None:
    plan = ToolPlan.for_request(request(tools=[WEATHER], tool_choice="none"), HERMES_TEMPLATE, model="m",
                                provider="p")
    assert plan.backend_request(request(tools=[WEATHER])).tools == ()
    text = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    assert plan.read(result(text)).text == text


def test_json_schema_with_tools_is_refused_in_process() -> None:
    with pytest.raises(UnsupportedOperationError, match="json_schema cannot be combined with tools"):
        ToolPlan.for_request(request(tools=[WEATHER], json_schema={"type": "object"}), HERMES_TEMPLATE,
                             model="m", provider="p")


STREAMED = [
    ("mistral", MISTRAL_TEMPLATE, '[TOOL_CALLS][{"name": "get_time", "arguments": {}}] and text'),
    ("hermes", HERMES_TEMPLATE,
     'Hi <tool_call>{"name": "get_weather", "arguments": {"city": "A"}}</tool_call> bye<tool'),
    ("hermes", HERMES_TEMPLATE, "plain <b>text</b> < tool_call"),
    ("json", LLAMA3_TEMPLATE, '{"name": "get_weather", "parameters": {"city": "A"}}'),
    ("json", LLAMA3_TEMPLATE, "  no call {here}"),
    ("mistral", MISTRAL_TEMPLATE, 'x[TOOL_CALLS][{"name": "get_time", "arguments": {}}]'),
]


@pytest.mark.parametrize(
    ("name", "template", "text"), STREAMED, ids=[f"{name}-{index}" for index, (name, _, _) in enumerate(STREAMED)]
)
def test_stream_pieces_join_to_the_text_of_the_result_whatever_the_cuts(name: str, template: str, text: str) -> None:
    plan = ToolPlan.for_request(request(tools=[WEATHER, TIME]), template, model="m", provider="p")
    expected = plan.read(result(text))
    for cuts in itertools.combinations(range(1, len(text)), 2):
        pieces = [text[: cuts[0]], text[cuts[0]: cuts[1]], text[cuts[1]:]]
        stream = ToolCallStream(plan)
        given = [stream.feed(piece) for piece in pieces] + [stream.flush()]
        assert "".join(given) == expected.text, (cuts, given)
        for index, piece in enumerate(given[:-1]):  # nothing of a call is ever given out
            assert '"name"' not in piece or expected.tool_calls is None, (cuts, index, piece)


def test_a_forced_calls_stream_gives_no_text() -> None:
    plan = ToolPlan.for_request(request(tools=[WEATHER], tool_choice="required"), HERMES_TEMPLATE, model="m",
                                provider="p")
    stream = ToolCallStream(plan)
    call = json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})
    assert "".join(stream.feed(char) for char in call) + stream.flush() == ""


def test_a_cut_call_list_keeps_its_finished_calls_and_an_argument_called_name_is_no_tool_name() -> None:
    """Reviewed defects of the cut-call handling: the finished call of a cut Mistral list was lost, and an
    argument called "name" was read as the tool's name."""
    plan = ToolPlan.for_request(request(tools=[WEATHER, TIME]), MISTRAL_TEMPLATE, model="m", provider="p")
    read = plan.read(result('[TOOL_CALLS][{"name": "get_time", "arguments": {}}, '
                            '{"name": "get_weather", "arguments": {"name": "Bob", "city": "Par', "length"))
    first, second = read.tool_calls or ()
    assert (first.name, first.arguments, first.error) == ("get_time", {}, None)
    assert (second.name, second.raw_arguments) == ("get_weather", '{"name": "Bob", "city": "Par')
    hermes = ToolPlan.for_request(request(tools=[WEATHER]), HERMES_TEMPLATE, model="m", provider="p")
    (call,) = hermes.read(result('<tool_call>{"name": "get_weather", "arguments": {"name": "Bob",}}</tool_call>')
                          ).tool_calls or ()
    assert call.name == "get_weather" and call.error is not None


def test_a_json_answer_with_a_name_key_is_the_answer_not_a_call() -> None:
    """Reviewed defect: with a bare-JSON template (Llama 3) and "auto", any object with a string "name" was a call:
    the answer {"name": "Ada Lovelace", ...} became text '' and a call named 'Ada Lovelace' with arguments {}."""
    plan = ToolPlan.for_request(request(tools=[WEATHER, TIME]), LLAMA3_TEMPLATE, model="m", provider="p")
    answer = '{"name": "Ada Lovelace", "born": 1815, "field": "mathematics"}'
    read = plan.read(result(answer))
    assert (read.text, read.tool_calls, read.finish_reason) == (answer, None, "stop")
    cut = '{"name": "Ada Lovelace", "born": 18'  # a JSON answer cut by max_tokens is the answer too
    assert plan.read(result(cut, "length")).text == cut
    # a call of a tool given, or an object with the call's arguments key, is still a call
    (call,) = plan.read(result('{"name": "get_time"}')).tool_calls or ()
    assert call.name == "get_time"
    (call,) = plan.read(result('{"name": "lookup", "parameters": {"q": 1}}')).tool_calls or ()
    assert call.name == "lookup" and "not a tool given" in (call.error or "")
    # a call of a tool given without its arguments key: the error keeps what the model wrote, not "{}"
    (call,) = plan.read(result('{"name": "get_weather", "city": "Oslo"}')).tool_calls or ()
    assert call.raw_arguments == '{"name": "get_weather", "city": "Oslo"}'
    assert "'city' is a required property" in (call.error or "")


def test_text_after_a_mistral_call_list_is_text_not_a_call() -> None:
    """Reviewed defect: text after a complete [TOOL_CALLS][...] list became a call named '' holding '] <text>' with
    an "Extra data" error, and the text was lost."""
    plan = ToolPlan.for_request(request(tools=[WEATHER, TIME]), MISTRAL_TEMPLATE, model="m", provider="p")
    for listed in ('[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
                   '[{"name": "get_weather", "arguments": {"city": "Paris"}},]'):  # a trailing comma too
        read = plan.read(result(f"[TOOL_CALLS]{listed} Let me check that for you."))
        assert read.text == " Let me check that for you."
        assert [(call.name, call.arguments, call.error) for call in read.tool_calls or ()] == [
            ("get_weather", {"city": "Paris"}, None)
        ]


def test_a_cut_call_is_named_by_its_own_name_not_an_arguments_name() -> None:
    """Reviewed defect: the first "name" anywhere named the call: arguments written before the call's name made
    a call of 'Bob'."""
    plan = ToolPlan.for_request(request(tools=[WEATHER, TIME]), HERMES_TEMPLATE, model="m", provider="p")
    text = '<tool_call>{"arguments": {"name": "Bob"}, "name": "get_weather"'
    (call,) = plan.read(result(text, "length")).tool_calls or ()
    assert call.name == "get_weather" and "raise max_tokens" in (call.error or "")
