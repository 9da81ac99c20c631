# -*- coding: utf-8 -*-
"""HTTP to a vLLM instance on the host's own loopback: the one client, for the vllm role's modules and its host
programs (vllm-watchdog, vllm-unit-helper: a copy next to them). Standard library only."""
from __future__ import annotations

import json
import urllib.error
import urllib.request


def http(url, payload=None, api_key="", timeout=30):
    """(status, body) of a GET (payload None) or JSON POST; status None when nothing answered."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    # http.client refuses such a header with a ValueError that quotes it, and so the key: say so without it.
    if any(ord(c) < 32 or ord(c) > 126 for value in headers.values() for c in value):
        return None, "the API key holds a character an HTTP header cannot carry (not shown)"
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")
    except OSError as err:
        return None, str(err)


def metrics_text(port, timeout=10):
    """The text of the instance's /metrics, or None when it did not answer 200 (stopped, dead or still loading)."""
    status, body = http("http://127.0.0.1:%d/metrics" % port, timeout=timeout)
    return body if status == 200 else None
