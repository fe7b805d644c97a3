"""The one error tree: every error descends from InferenceError, server errors are httpx errors, pickling."""

from __future__ import annotations

import httpx
import pytest

from inference import exceptions
from inference.exceptions import (
    AdapterNotFoundError,
    InferenceError,
    MissingDependencyError,
    ServerResponseError,
    UnknownProviderError,
)


def test_every_error_descends_from_one_base() -> None:
    for name in exceptions.__all__:
        assert issubclass(getattr(exceptions, name), InferenceError), name
    assert issubclass(ServerResponseError, httpx.HTTPStatusError)
    assert issubclass(UnknownProviderError, ValueError)
    assert issubclass(MissingDependencyError, ImportError)
    assert exceptions.__doc__ is not None and "ServerResponseError" in exceptions.__doc__


def test_server_errors_are_httpx_status_errors_with_the_sdk_attributes() -> None:
    request = httpx.Request("POST", "http://127.0.0.1:8100/v1/load_lora_adapter")
    response = httpx.Response(404, request=request, json={"detail": "Not Found"})
    error = exceptions.RuntimeLoRADisabledError(
        "start vLLM with --enable-lora", request=request, response=response, provider="vllm", url="http://x/v1"
    )
    with pytest.raises(httpx.HTTPStatusError) as caught:
        raise error
    assert caught.value.response.status_code == 404 and caught.value.request is request
    assert (error.status_code, error.provider, error.url, str(error)) == (
        404,
        "vllm",
        "http://x/v1",
        "start vLLM with --enable-lora",
    )
    assert isinstance(
        exceptions.ServerAdapterNotFoundError("gone", request=request, response=response), AdapterNotFoundError
    )


def test_errors_survive_pickling_with_their_attributes() -> None:
    import pickle

    request = httpx.Request("POST", "http://127.0.0.1:8100/v1/chat/completions")
    response = httpx.Response(404, request=request, json={"error": {"message": "gone"}})
    errors = [
        AdapterNotFoundError("adapter 'a' is not loaded", provider="fake", path="/x"),
        exceptions.ServerModelNotFoundError("model gone", request=request, response=response, provider="vllm"),
    ]
    for error in errors:
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error)
        assert (copy.provider, copy.path) == (error.provider, error.path)
    assert copy.status_code == 404
    too_long = exceptions.ServerTokenLimitError("too long", limit=512, value=600, request=request, response=response,
                                                provider="vllm")
    copy = pickle.loads(pickle.dumps(too_long))
    assert type(copy) is type(too_long)
    assert (copy.limit, copy.value, copy.kind, copy.provider) == (512, 600, "context", "vllm")
