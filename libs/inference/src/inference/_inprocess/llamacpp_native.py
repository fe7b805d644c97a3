"""llama.cpp's C API where llama-cpp-python's ``Llama`` class does not reach: contexts, adapters, aborts, log lines.

Everything here takes the ``llama_cpp`` module (or a ``Llama`` object) as an argument and runs on the provider's
worker thread, except the log filter, which llama.cpp calls from whichever thread logs:

- :func:`share_context`: the provider's context (``n_parallel`` sequences in one unified KV cache, flash attention
  as asked) in place of the one-sequence context ``Llama`` makes;
- :func:`has_adapter_api`, :func:`init_adapter`, :func:`free_adapter`, :func:`set_context_adapters`: LoRA adapters
  loaded once and set on the context per request (the hot-swap API);
- :class:`PromptAbort` and :func:`clear_abort_callback`: ``llama_decode`` stopped between graph nodes once a
  request is cancelled;
- :func:`install_log_filter` and :func:`set_thread_log_mode`: llama.cpp's log lines printed per provider, by thread.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "ADAPTER_API",
    "PromptAbort",
    "clear_abort_callback",
    "free_adapter",
    "has_adapter_api",
    "init_adapter",
    "install_log_filter",
    "set_context_adapters",
    "set_thread_log_mode",
    "share_context",
]

ADAPTER_API = ("llama_adapter_lora_init", "llama_adapter_lora_free", "llama_set_adapters_lora")
"""The functions hot-swap needs; a llama-cpp-python without them runs in reload mode."""


def share_context(llama: Any, n_parallel: int, flash_attn: bool) -> None:
    """Give ``llama`` the provider's context: ``n_parallel`` sequences sharing one KV cache of ``n_ctx`` cells, and
    flash attention as asked.

    llama-cpp-python's ``Llama`` makes a one-sequence context; this replaces it with the same settings plus
    ``n_seq_max``, the flash attention setting and a unified KV cache (each sequence may use any cell, so one
    request alone still has the whole context). The new context is freed with the model, before it.
    """
    from llama_cpp import _internals

    llama_cpp = sys.modules["llama_cpp"]
    params = llama.context_params
    params.n_seq_max = n_parallel
    if hasattr(params, "kv_unified"):
        params.kv_unified = n_parallel > 1
    if hasattr(params, "flash_attn_type"):
        params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
    shared = _internals.LlamaContext(model=llama._model, params=params, verbose=llama.verbose)
    single, llama._ctx = llama._ctx, shared
    single.close()
    adapter = getattr(llama, "_lora_adapter", None)  # reload mode: the adapter Llama set on the old context
    if adapter is not None:
        adapters = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(adapter)
        scales = (ctypes.c_float * 1)(1.0)
        if llama_cpp.llama_set_adapters_lora(shared.ctx, adapters, 1, scales):
            raise RuntimeError("llama.cpp could not set the LoRA adapter on the shared context")


# Adapters ---------------------------------------------------------------------------------------------------


def has_adapter_api(llama_cpp: Any) -> bool:
    """True when llama-cpp-python exports llama.cpp's adapter API (:data:`ADAPTER_API`)."""
    return all(hasattr(llama_cpp, name) for name in ADAPTER_API)


def init_adapter(llama_cpp: Any, llama: Any, gguf_path: Path) -> Any:
    """Load a GGUF LoRA for ``llama``'s model (valid while the model lives); a NULL handle when llama.cpp refuses it
    (tensor names or shapes the model lacks). The path goes as its own bytes, whatever its encoding."""
    return llama_cpp.llama_adapter_lora_init(llama.model, os.fsencode(gguf_path))


def free_adapter(llama_cpp: Any, handle: Any) -> None:
    """Free an adapter loaded by :func:`init_adapter`."""
    llama_cpp.llama_adapter_lora_free(handle)


def set_context_adapters(llama_cpp: Any, llama: Any, applied: Sequence[tuple[Any, float]]) -> None:
    """Make ``applied`` (handle, scale pairs) the context's adapters (``[]`` clears them); reset the KV cache."""
    if not applied:
        llama_cpp.llama_set_adapters_lora(llama.ctx, None, 0, None)
    else:
        adapters = (llama_cpp.llama_adapter_lora_p_ctypes * len(applied))(*(handle for handle, _ in applied))
        scales = (ctypes.c_float * len(applied))(*(scale for _, scale in applied))
        llama_cpp.llama_set_adapters_lora(llama.ctx, adapters, len(applied), scales)
    llama.reset()  # Llama.generate would otherwise reuse KV entries computed under the other adapter


# Aborts -----------------------------------------------------------------------------------------------------


def clear_abort_callback(llama_cpp: Any, ctx: Any) -> None:
    """Remove the context's abort callback (``llama_decode`` then runs every step to its end)."""
    llama_cpp.llama_set_abort_callback(ctx, llama_cpp.ggml_abort_callback(), None)


class PromptAbort:
    """llama.cpp's abort callback on a context while a prompt is evaluated: ``llama_decode`` stops between graph
    nodes once ``cancel`` is set (a long prompt is seconds of work on a busy CPU).

    Set on creation; :meth:`lift` removes it once the prompt is in (one-token steps need no abort, and it costs
    a Python call per graph node).

    Args:
        llama_cpp: The ``llama_cpp`` module.
        ctx: The context.
        cancel: Set when the request's caller gives up.
    """

    def __init__(self, llama_cpp: Any, ctx: Any, cancel: threading.Event) -> None:
        self._llama_cpp = llama_cpp
        self._ctx = ctx
        self._callback = llama_cpp.ggml_abort_callback(lambda _data: cancel.is_set())  # referenced while set
        llama_cpp.llama_set_abort_callback(ctx, self._callback, None)
        self.active = True

    def lift(self) -> None:
        """Remove the callback (again: nothing)."""
        if self.active:
            clear_abort_callback(self._llama_cpp, self._ctx)
            self.active = False


# Log lines --------------------------------------------------------------------------------------------------

_log_mode = threading.local()  # ``verbose`` of the provider whose worker this thread is; unset elsewhere
_log_filter_lock = threading.Lock()
_log_filter: Any = None  # the installed ctypes callback (kept referenced: llama.cpp calls it for ever)


def set_thread_log_mode(verbose: bool) -> None:
    """Worker-thread initializer: llama.cpp's log lines from this thread print only if ``verbose``."""
    _log_mode.verbose = verbose


def install_log_filter(llama_cpp: Any) -> None:
    """Route llama.cpp's log lines by thread, once per process (``llama_log_set`` is process-wide).

    On a provider's worker thread, a line goes to stderr only when that provider has ``verbose=True``;
    with ``verbose=False`` nothing is printed. llama-cpp-python's own filter cannot be relied on: it
    reads ggml's log levels with an older numbering, so with ``verbose=False`` it prints llama.cpp's
    warnings (e.g. "n_ctx_seq (4096) > n_ctx_train (512)" when a context is created) and hides its
    errors, and only the model load itself runs with stderr redirected. Lines logged on any other
    thread (a ``Llama`` the application uses itself) still go to llama-cpp-python's callback.
    """
    global _log_filter
    with _log_filter_lock:
        if _log_filter is not None or not hasattr(llama_cpp, "llama_log_set"):
            return
        try:
            from llama_cpp import _logger

            fallback = getattr(_logger, "llama_log_callback", None)
        except ImportError:  # another llama-cpp-python layout: lines off our threads are dropped
            fallback = None

        def route(level: int, text: bytes | None, user_data: Any) -> None:
            verbose = getattr(_log_mode, "verbose", None)
            if verbose is None:
                if fallback is not None:
                    fallback(level, text, user_data)
            elif verbose and text:
                sys.stderr.write(text.decode("utf-8", errors="replace"))
                sys.stderr.flush()

        _log_filter = llama_cpp.llama_log_callback(route)
        llama_cpp.llama_log_set(_log_filter, ctypes.c_void_p(0))
