"""Slow imports a request needs run on a worker thread, never on the event loop.

``jsonschema`` takes seconds to import where ``rfc3987-syntax`` is installed (it builds a grammar at import), and the
first request with a ``json_schema`` or tools imported it on the loop, stalling every other request meanwhile.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

WATCH = """
import asyncio, sys, threading
from inference.fake_provider import FakeProvider

seen = []

class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "jsonschema.validators":
            seen.append(threading.current_thread() is threading.main_thread())
        return None

sys.meta_path.insert(0, Watch())

async def main():
    async with FakeProvider() as provider:
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
        if sys.argv[1] == "generate":
            await provider.generate("hi", model="m", max_tokens=40, json_schema=schema)
        else:
            async for _ in provider.stream("hi", model="m", max_tokens=40, json_schema=schema):
                pass

asyncio.run(main())
print(seen)
"""


@pytest.mark.parametrize("method", ["generate", "stream"])
def test_the_first_json_schema_request_imports_jsonschema_off_the_event_loop(method: str) -> None:
    done = subprocess.run([sys.executable, "-c", WATCH, method], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[False]", done.stderr  # imported once, on a worker thread
