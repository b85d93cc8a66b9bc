"""swarm.client.telemetry: the summary line a user reads."""

from __future__ import annotations

from swarm.client.telemetry import FailoverEvent, GenerationTelemetry


def test_summary_says_where_a_failover_happened_in_generated_or_prompt_tokens():
    t = GenerationTelemetry(backend="swarm", prompt_tokens=30)
    t.failovers = [
        FailoverEvent("12D3KooWaaaaaaaaaaaa", 10, 20, "unreachable", "reset", position=30 + 59,
                      replayed_tokens=89, stall_ms=812.0),
        FailoverEvent("12D3KooWbbbbbbbbbbbb", 0, 10, "timeout", "no frame", position=16),
    ]
    lines = t.summary().splitlines()
    assert lines[1] == ("  failover [10:20) 12D3KooWaaaa… (unreachable) after 60 generated tokens: "
                        "replayed 89 tokens, stall 812 ms")
    assert "(timeout) after 16 of 30 prompt tokens:" in lines[2]


def test_summary_and_usage_carry_speculation_counts():
    from swarm.api.openai_schema import usage
    from swarm.spec.verify import Acceptance

    t = GenerationTelemetry(backend="swarm", prompt_tokens=30)
    assert "speculation" not in t.summary()
    assert "speculation" not in usage(30, 10).model_dump()
    t.speculation = Acceptance(passes=4, drafted=16, accepted=12)
    assert "speculation: 12/16 drafted tokens accepted (75%), 4.00 tokens per pass" in t.summary()
    assert "sent ahead" not in t.summary()
    t.speculation.ahead_sent, t.speculation.ahead_used = 3, 2
    assert "4.00 tokens per pass, 2/3 passes sent ahead used" in t.summary()
    assert usage(30, 17, t.speculation).model_dump()["speculation"] == {
        "passes": 4, "drafted_tokens": 16, "accepted_tokens": 12, "acceptance_rate": 0.75,
        "tokens_per_pass": 4.0, "passes_sent_ahead": 3, "passes_sent_ahead_used": 2,
    }
    assert t.to_dict()["speculation"] == {"passes": 4, "drafted": 16, "accepted": 12, "ahead_sent": 3,
                                          "ahead_used": 2}
