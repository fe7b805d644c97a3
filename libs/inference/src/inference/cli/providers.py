"""``inference providers``: which providers are installed and whether their servers answer."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
from pathlib import Path
from typing import Any

from inference._core.env_file import is_set, settings_environment
from inference._core.redaction import redact_url
from inference.cli.options import SERVER_PROVIDERS
from inference.cli.running import _print_json
from inference.config import resolve_settings
from inference.exceptions import ConfigurationError
from inference.registry import PROVIDER_EXTRAS, PROVIDER_REGISTRY, PROVIDERS

__all__ = ["PROVIDER_PACKAGES"]


PROVIDER_PACKAGES: dict[str, tuple[str, ...]] = {name: spec.packages for name, spec in PROVIDERS.items()}
"""The import names each provider needs (what its pip extra installs; from the registry)."""


def _providers(args: argparse.Namespace) -> int:
    urls = {name: getattr(args, f"{name.replace('-', '_')}_url") for name in SERVER_PROVIDERS}
    reports = [_provider_report(name, urls.get(name)) for name in PROVIDER_REGISTRY]
    checks = {report["name"]: report["base_url"] for report in reports if report["base_url"]}
    reachability = asyncio.run(_check_urls(checks, args.timeout)) if checks else {}
    for report in reports:
        if report["name"] in reachability:
            report["reachable"], report["detail"] = reachability[report["name"]]
        if report["base_url"]:
            report["base_url"] = redact_url(report["base_url"])  # shown: credentials in the URL hidden
    if args.json:
        _print_json({"providers": reports})
        return 0
    for report in reports:
        state = "installed" if report["installed"] else f"missing {', '.join(report['missing'])}"
        if not report["installed"] and report["extra"]:
            state += f" (pip install 'inference-adapters[{report['extra']}]')"
        line = f"{report['name']:<13} {state}"
        if report["base_url"]:
            line += f"; {report['base_url']} " + ("reachable" if report["reachable"] else "unreachable")
        if report["detail"]:
            line += f" ({report['detail']})"
        print(line)
    return 0


def _provider_report(name: str, url: str | None) -> dict[str, Any]:
    missing = [package for package in PROVIDER_PACKAGES.get(name, ()) if not _installed(package)]
    report: dict[str, Any] = {
        "name": name,
        "installed": not missing,
        "missing": missing,
        "extra": PROVIDER_EXTRAS.get(name),
        "server": name in SERVER_PROVIDERS,
        "base_url": None,
        "reachable": None,
        "detail": None,
    }
    try:
        settings = resolve_settings(name, {"base_url": url} if url else {})
    except ConfigurationError as error:
        report["detail"] = str(error)
        return report
    spec = PROVIDERS.get(name)
    if spec is None:
        return report
    if spec.server:
        report["base_url"] = settings["base_url"]
        base_url_setting = next(setting for setting in spec.settings if setting.key == "base_url")
        configured = is_set(settings_environment().get(base_url_setting.env_var))  # the process's, else .env's
        if not url and not configured and not _on_this_machine(settings["base_url"]):
            report["base_url"] = None  # a remote default (https://api.openai.com/v1): not contacted unasked
            report["detail"] = (
                f"not checked: the default {redact_url(settings['base_url'])} is remote; give --{name}-url or set "
                f"{base_url_setting.env_var}"
            )
    elif spec.model_setting:
        variable = next(setting.env_var for setting in spec.settings if setting.key == spec.model_setting)
        report["detail"] = _model_detail(settings.get(spec.model_setting), variable)
    return report


def _on_this_machine(base_url: str) -> bool:
    from urllib.parse import urlsplit

    hosts = {urlsplit(url).hostname for url in base_url.split(",") if url}
    return hosts <= {"localhost", "127.0.0.1", "::1"}


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def _model_detail(model: str | None, variable: str) -> str:
    if not model:
        return f"no model configured (set {variable})"
    return f"model {model}" + ("" if Path(model).exists() else " (not found on this machine)")


async def _check_urls(urls: dict[str, str], timeout: float) -> dict[str, tuple[bool, str | None]]:
    try:
        import httpx

        from inference._servers.http import api_base, base_url_query
    except ImportError:
        return {name: (False, "cannot check: httpx is not installed") for name in urls}

    async def check(client: httpx.AsyncClient, base_url: str) -> tuple[bool, str | None]:
        urls, answered, notes = base_url.split(","), 0, []
        for url in urls:
            try:
                response = await client.get(f"{api_base(url)}/models", params=base_url_query(url))
            except httpx.HTTPError as error:
                notes.append(f"{redact_url(url)}: {type(error).__name__}")
                continue
            answered += 1
            if response.status_code >= 400:  # something answers: reachable, but say what it said
                notes.append(f"{redact_url(url)}: answered HTTP {response.status_code}")
        if 0 < answered < len(urls):  # some replicas answer: reachable, but not the whole fleet
            notes.insert(0, f"degraded: {answered} of {len(urls)} replicas answer")
        return answered > 0, "; ".join(notes) or None

    async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:  # no proxy, as the providers
        answers = await asyncio.gather(*(check(client, url) for url in urls.values()))
    return dict(zip(urls, answers, strict=True))
