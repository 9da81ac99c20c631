# -*- coding: utf-8 -*-
"""HTTP to a vLLM instance on the host's own loopback, for the vllm role's modules (standard library only)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request


def http(url, payload=None, api_key="", timeout=30):
    """(status, body) of a GET (payload None) or JSON POST; status None when nothing answered."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")
    except OSError as err:
        return None, str(err)
