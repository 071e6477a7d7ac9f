"""The ``respflow`` CLI contract (acceptance checks call exactly this)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests._support import FIXTURES, completed, created, in_progress, sse, text_delta


def respflow(*args: str, stdin: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "respflow", *args], input=stdin, capture_output=True, timeout=timeout, check=False
    )


def test_fold_prints_the_response_json() -> None:
    result = respflow("fold", str(FIXTURES / "function-call-vllm-gemma4.sse"))
    assert result.returncode == 0, result.stderr
    response = json.loads(result.stdout)
    assert response["output"][0]["name"] == "get_weather"
    assert json.loads(response["output"][0]["arguments"]) == {"city": "San Francisco"}
    assert response["usage"]["total_tokens"] == 87


def test_fold_reads_stdin_and_takes_id_and_model() -> None:
    body = (FIXTURES / "text-openai-gpt-4o.sse").read_bytes()
    result = respflow("fold", "-", "--response-id", "resp_gw", "--model", "pub", stdin=body)
    assert result.returncode == 0
    response = json.loads(result.stdout)
    assert (response["id"], response["model"]) == ("resp_gw", "pub")


def test_strict_violation_exits_1_with_code_and_line() -> None:
    body = sse(created(), in_progress(), text_delta("x"), completed())
    result = respflow("fold", "-", "--strict", stdin=body)
    assert result.returncode == 1
    assert result.stdout == b""
    assert result.stderr.decode().strip() == (
        "error[no_active_item]: upstream stream event 'response.output_text.delta' has no active "
        "output item at output[0] (line 5)"
    )


def test_lenient_is_the_default() -> None:
    body = sse(created(), in_progress(), text_delta("x"), completed())
    assert respflow("fold", "-", stdin=body).returncode == 0


def test_bad_input_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    result = respflow("fold", str(tmp_path / "missing.sse"))
    assert result.returncode == 1
    assert result.stderr.decode().startswith("error[input]:")
    bad = tmp_path / "bad.sse"
    bad.write_bytes(b"data: " + b"x" * 2_000_000 + b"\n\n")
    result = respflow("fold", str(bad))
    assert result.returncode == 1
    assert result.stderr.decode().startswith("error[line_too_long]:")
    assert b"Traceback" not in result.stderr


def test_strict_eof_without_terminal_has_no_line() -> None:
    result = respflow("fold", "-", "--strict", stdin=sse(created(), in_progress()))
    assert result.returncode == 1
    assert result.stderr.decode().startswith("error[eof_without_terminal]:")


def test_tools_restore_a_recorded_namespace_call(tmp_path: Path) -> None:
    """The recorded vLLM call uses the flat name; with the client's namespace declaration
    the fold and the relay give it back as namespace + name."""
    tools = tmp_path / "tools.json"
    member = {"type": "function", "name": "add_numbers", "parameters": {"type": "object", "properties": {"numbers": {"type": "array", "items": {"type": "number"}}}}}
    tools.write_text(json.dumps([{"type": "namespace", "name": "mcp__agentic_fixture", "description": "fixture", "tools": [member]}]))
    fixture = str(FIXTURES / "namespace-flat-vllm-qwen3.6-35b-turn1.sse")
    result = respflow("fold", fixture, "--tools", str(tools))
    assert result.returncode == 0, result.stderr
    call = json.loads(result.stdout)["output"][-1]
    assert (call["type"], call["namespace"], call["name"]) == ("function_call", "mcp__agentic_fixture", "add_numbers")
    relayed = respflow("relay", fixture, "--tools", str(tools))
    assert relayed.returncode == 0
    assert b'"name":"agentic_ns__' not in relayed.stdout  # (the model names it in its reasoning text)
    assert b'"namespace":"mcp__agentic_fixture"' in relayed.stdout


def test_a_bad_tools_file_is_an_error(tmp_path: Path) -> None:
    bad = tmp_path / "tools.json"
    bad.write_text("{not json")
    result = respflow("fold", str(FIXTURES / "text-openai-gpt-4o.sse"), "--tools", str(bad))
    assert result.returncode == 1 and result.stderr.decode().startswith("error[bad_tools]:")
    bad.write_text('{"type": "function"}')
    result = respflow("fold", str(FIXTURES / "text-openai-gpt-4o.sse"), "--tools", str(bad))
    assert result.returncode == 1 and result.stderr.decode().startswith("error[bad_tools]:")


def test_bench_prints_its_table_as_json() -> None:
    result = respflow("bench", "--quick", "--json", "--detail", timeout=180)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    rows = out["core"]
    assert [r["name"].split(" ")[0] for r in rows] == ["floor", "core", "relay"]
    assert rows[0]["ratio_to_floor"] == 1.0
    assert all(r["events"] == rows[0]["events"] > 1000 for r in rows)
    for row in rows:
        assert set(row) == {"name", "bytes", "events", "median_s", "events_per_s", "mb_in_per_s", "ratio_to_floor"}
        assert all(isinstance(row[k], int | float) and row[k] > 0 for k in row if k != "name")
        assert 0 < row["ratio_to_floor"] <= 1.0 + 1e-9 or row is rows[0]
    detail = out["detail"]
    assert set(detail["stage_ns_per_event"]) == {"split", "normalize", "orjson.loads", "validate", "fold", "translate"}
    assert all(ns > 0 for ns in detail["stage_ns_per_event"].values())
    assert detail["json_loads_x_orjson"] > 1  # orjson is the faster parser, or why depend on it
    assert [r["recording"] for r in detail["recorded"]] == ["reasoning-vllm-qwen3-30b.sse", "text-openai-gpt-4o.sse", "tool-call-auto-qwen3-30b.sse"]
    assert all(r["events"] > 0 and r["ratio_to_floor"] > 0 for r in detail["recorded"])
    assert all(v > 0 for v in detail["gc_freeze"].values())
    # the trickle rows: one event per read through the graph and the relay (it checks itself
    # that every event reached the sink), alone and with 200 streams interleaved
    assert set(detail["trickle"]) == {"1", "200"}
    assert all(set(row) == {"graph_us", "relay_us"} and all(v > 0 for v in row.values()) for row in detail["trickle"].values())


def test_bench_prints_a_table_with_units() -> None:
    result = respflow("bench", "--quick", timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    assert lines[0].split() == ["workload", "events", "median", "s", "events/s", "MB/s", "in", "x", "floor"]
    rows = [line for line in lines[1:] if line.strip()]
    assert [r.split()[0] for r in rows] == ["floor", "core", "relay"]
    for row in rows:
        numbers = row.split()[-5:]  # events, median s, events/s, MB/s, x floor
        assert all(float(n) > 0 for n in numbers), row


def test_bench_store_measures_both_backends_against_no_store() -> None:
    result = respflow("bench", "--store", "--quick", "--json", timeout=300)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    backends = ["sqlite", "postgresql"] if out["postgresql"].startswith("a throwaway") else ["sqlite"]
    alone = out["store"]
    assert [(r["backend"], r["concurrency"]) for r in alone] == [(b, c) for b in backends for c in (1, 4, 16)]
    for row in alone:
        assert row["requests"] >= 80 and row["requests_per_s"] > 0
        assert 0 < row["p50_ms"] <= row["p99_ms"]
    served = out["end_to_end"]
    assert [(r["store"], r["concurrency"]) for r in served] == [(s, c) for c in (1, 4, 16) for s in ["none", *backends]]
    for row in served:
        assert row["errors"] == 0, row["first_error"]
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        assert (row["added_p50_ms"] is None) == (row["store"] == "none")


def test_bench_background_measures_plain_background_and_resumed_streams() -> None:
    result = respflow("bench", "--serve", "--background", "--quick", "--json", timeout=300)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["background"]
    stores = sorted({r["store"] for r in rows})
    assert "sqlite" in stores
    modes = ["plain", "background", "background, cut + resumed"]
    assert [(r["store"], r["mode"]) for r in rows] == [(s, m) for s in [r["store"] for r in rows][::3] for m in modes]
    for row in rows:
        assert row["errors"] == 0, row["first_error"]
        assert row["events"] == 100 * 40, row  # every delta of every stream, the resumed ones too
        assert row["cpu_us_per_event"] > 0
        assert (row["resume_p50_ms"] is not None) == (row["mode"] == modes[2])
        assert row["cpu_x_plain"] == 1.0 if row["mode"] == "plain" else row["cpu_x_plain"] > 0
        assert (row["db_us_per_event"] is not None) == (row["store"] == "postgresql")


def test_bench_metrics_cost_compares_two_gateways() -> None:
    result = respflow("bench", "--serve", "--metrics-cost", "--quick", "--json", timeout=300)
    assert result.returncode == 0, result.stderr
    on, off = json.loads(result.stdout)["metrics_cost"]
    assert (on["target"], off["target"]) == ("metrics on", "--no-metrics")
    assert on["errors"] == off["errors"] == 0 and on["events"] == off["events"] == 100 * 40
    assert 0 < on["in_process_us_per_event"] < 50
    assert on["metrics_us_per_event"] == round(on["cpu_us_per_event"] - off["cpu_us_per_event"], 2)


def test_bench_request_measures_the_gateway_in_process() -> None:
    result = respflow("bench", "--request", "--quick", "--json", "--sizes", "1,11", "--requests", "30", timeout=120)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [r["deltas"] for r in rows] == [1, 11]
    # each client got the head (created, in_progress, the item, its part), the deltas and the tail
    # (text done, part done, item done, completed): the canned stream went through whole
    assert [r["events"] for r in rows] == [9, 19]
    assert all(r["us_per_request"] > 0 for r in rows)
    assert "us_per_further_event" not in rows[0] and rows[1]["us_per_further_event"] != 0


def test_bench_request_refuses_bad_sizes() -> None:
    result = respflow("bench", "--request", "--sizes", "one", timeout=60)
    assert result.returncode == 2
    assert result.stderr.decode().startswith("error[bad_bench]:")
