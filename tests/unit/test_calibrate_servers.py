"""`servepilot calibrate` against servers it cannot calibrate (unreachable, no OpenAI model
list, not vLLM, an unknown model): a clear error that names the problem, and the facts it reads
from a vLLM server. Small HTTP servers on 127.0.0.1 stand in for them."""

from __future__ import annotations

import http.server
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from servepilot.calibrate.server import server_facts
from servepilot.cli.main import main
from servepilot.core.errors import ConfigError, EngineError
from servepilot.engine.metrics import EngineMetric, scrape
from tests.unit.http_thread import serving


class _Handler(http.server.BaseHTTPRequestHandler):
    pages: ClassVar[dict[str, tuple[int, str]]] = {}

    def do_GET(self) -> None:
        status, body = self.pages.get(self.path, (404, "not found"))
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, dict[str, tuple[int, str]]]]:
    pages: dict[str, tuple[int, str]] = {}
    handler = type("Handler", (_Handler,), {"pages": pages})
    with serving(handler) as url:
        yield url, pages


MODELS = '{"data": [{"id": "smollm2", "max_model_len": 2048}]}'
METRICS = (
    'vllm:cache_config_info{block_size="128",enable_prefix_caching="True",'
    'num_gpu_blocks="364"} 1.0\nvllm:prefix_cache_hits_total{engine="0"} 256.0\n'
)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_an_unreachable_url_is_an_engine_error() -> None:
    with pytest.raises(EngineError, match="cannot reach") as info:
        server_facts(f"http://127.0.0.1:{_closed_port()}", None, None)
    assert "--url" in str(info.value)


def test_a_server_without_an_openai_model_list(
    server: tuple[str, dict[str, tuple[int, str]]],
) -> None:
    url, pages = server
    with pytest.raises(EngineError, match="answered HTTP 404"):
        server_facts(url, None, None)
    pages["/v1/models"] = (200, "<html>hello</html>")
    with pytest.raises(EngineError, match="did not answer JSON"):
        server_facts(url, None, None)


def test_a_server_that_is_not_vllm(server: tuple[str, dict[str, tuple[int, str]]]) -> None:
    url, pages = server
    pages["/v1/models"] = (200, MODELS)
    pages["/metrics"] = (200, "servepilot_requests_total 3\n")
    with pytest.raises(EngineError, match="not a vLLM server"):
        server_facts(url, None, None)


def test_an_unknown_model_names_the_flag(server: tuple[str, dict[str, tuple[int, str]]]) -> None:
    url, pages = server
    pages["/v1/models"] = (200, MODELS)
    pages["/metrics"] = (200, METRICS)
    with pytest.raises(ConfigError, match=r"--model 'llama'.*serves smollm2"):
        server_facts(url, "llama", None)


def test_a_vllm_server_is_described(server: tuple[str, dict[str, tuple[int, str]]]) -> None:
    url, pages = server
    pages["/v1/models"] = (200, MODELS)
    pages["/metrics"] = (200, METRICS)
    pages["/version"] = (200, '{"version": "0.32.0"}')
    facts = server_facts(url, None, None)
    assert (facts.model, facts.max_model_len, facts.version) == ("smollm2", 2048, "0.32.0")
    assert (facts.block_size, facts.num_blocks, facts.kv_tokens) == (128, 364, 46_592)
    assert facts.prefix_caching is True
    # What the probes read; a name that only starts like it is not it: test_engine_metrics.
    assert scrape(METRICS).total(EngineMetric.PREFIX_CACHE_HITS) == 256.0


def test_the_command_prints_one_error_line_and_no_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    code = main(["calibrate", "--url", url, "--out", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert code == 1
    assert "error: cannot reach" in err and "Traceback" not in err
    assert not (tmp_path / "p.json").exists()
    assert main(["calibrate", "--url", "localhost:8000"]) == 2
    assert "--url 'localhost:8000'" in capsys.readouterr().err
    assert main(["calibrate", "--url", url, "--max-prompt-tokens", "1"]) == 2
    assert "--max-prompt-tokens" in capsys.readouterr().err
    assert main(["calibrate", "--url", url, "--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
