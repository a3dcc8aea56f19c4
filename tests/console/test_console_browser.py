"""The web console, used as a person would, in headless Chromium against a 3-node cluster:
each test checks what the page shows against the API (or what the API shows after the page
acted), and that the browser logged no error."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.console.conftest import Console
from tests.node.cluster_fixture import Cluster, http
from tests.support import ADMIN_TOKEN, wait_for

pytestmark = pytest.mark.slow

expect = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]'").expect


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def api(
    cluster: Cluster, method: str, path: str, body: Any = None, token: str = ADMIN_TOKEN
) -> Any:
    code, out = http(method, cluster.url("n1") + path, body, token=token)
    assert code < 300, (method, path, code, out)
    return out


def publish(cluster: Cluster, topic: str, n: int) -> None:
    msgs = [{"text": f"m{i}"} for i in range(n)]
    api(cluster, "POST", f"/topics/{topic}/publish", {"messages": msgs})


def test_sign_in_refuses_a_bad_token_then_signs_in_and_out(console: Console) -> None:
    page = console.page
    console.allowed.append("status of 401")  # the refused sign-in's request, on purpose
    console.open()
    expect(page.locator("#token")).to_be_focused()
    page.fill("#token", "rq_nosuch.AAAAAAAAAAAAAAAAAAAAAAAA")
    page.keyboard.press("Enter")
    expect(page.locator("form.signin .msg")).to_contain_text("Token refused")
    expect(page.locator("#nav")).to_be_hidden()  # (no pages before signing in)
    console.shot("signin")
    console.sign_in(ADMIN_TOKEN)
    expect(page.locator("#who")).to_contain_text("admin")
    assert page.evaluate("sessionStorage.getItem('raftq.token')") == ADMIN_TOKEN
    assert page.evaluate("localStorage.length") == 0  # never kept beyond the tab
    page.click("#signout")
    expect(page.locator("#token")).to_be_visible()
    expect(page.locator("#nav")).to_be_hidden()
    assert page.evaluate("sessionStorage.getItem('raftq.token')") is None
    console.check()


def test_the_overview_shows_the_right_counts_and_every_node(
    console: Console, cluster: Cluster
) -> None:
    for i, n in enumerate((2, 3, 4)):
        topic = _name(f"ov{i}")
        api(cluster, "POST", "/topics", {"topic": topic})
        publish(cluster, topic, n)
    stats = api(cluster, "GET", "/topics?stats=1")["stats"]
    console.sign_in(ADMIN_TOKEN)
    page = console.page
    expect(page.locator("[data-total=topics] .value")).to_have_text(str(len(stats)))
    messages = sum(s["messages"] for s in stats)
    expect(page.locator("[data-total=messages] .value")).to_have_text(f"{messages:,}")
    expect(page.locator("#nodes tr")).to_have_count(3)
    expect(page.locator("#nodes [data-up=up]")).to_have_count(3)
    leader = cluster.leader()
    expect(page.locator(f"#nodes tr[data-node={leader}]")).to_contain_text("leader")
    expect(page.locator("#nodes")).to_contain_text("MiB")  # each node's RSS
    # rates: drawn once two samples were taken
    publish(cluster, stats[0]["topic"], 5)
    expect(page.locator("[data-rate=publish] svg polyline")).to_have_count(1, timeout=15_000)
    console.shot("overview")
    page.set_viewport_size({"width": 1920, "height": 1000})
    console.shot("overview-wide")
    assert page.evaluate("document.documentElement.scrollWidth <= innerWidth")
    console.check()


def test_a_topic_created_through_the_ui_exists_in_the_api(
    console: Console, cluster: Cluster
) -> None:
    console.sign_in(ADMIN_TOKEN)
    page = console.page
    console.go("#/topics")
    topic = _name("ui-made")
    page.fill("#new-topic", topic)
    page.click("#create-topic button[type=submit]")
    expect(page.locator("#create-topic ~ .msg, .msg")).to_contain_text(f"Created {topic}")
    assert http("GET", cluster.url("n2") + f"/topics/{topic}")[0] == 200  # (another node too)
    expect(page.locator(f"tbody tr[data-key='{topic}']")).to_have_count(1)
    # sortable: by messages, descending then ascending, from the keyboard
    page.locator("th[data-key=messages] button").focus()
    page.keyboard.press("Enter")
    expect(page.locator("th[data-key=messages]")).to_have_attribute("aria-sort", "descending")
    page.keyboard.press("Enter")
    expect(page.locator("th[data-key=messages]")).to_have_attribute("aria-sort", "ascending")
    page.keyboard.press("Escape")
    page.locator("main").focus()
    page.keyboard.press("/")
    expect(page.locator("#filter")).to_be_focused()
    page.keyboard.type(topic)
    expect(page.locator("tbody tr")).to_have_count(1)
    console.shot("topics")
    console.check()


def test_publish_and_peek_through_the_ui(console: Console, cluster: Cluster) -> None:
    topic = _name("pub")
    api(cluster, "POST", "/topics", {"topic": topic})
    console.sign_in(ADMIN_TOKEN)
    page = console.page
    console.go(f"#/topic/{topic}")
    page.fill("#publish-text", "hello from the console")
    page.click("#publish button[type=submit]")
    expect(page.locator("#publish .msg")).to_contain_text("Published as seq 1")
    peeked = api(cluster, "GET", f"/topics/{topic}/messages?payload_encoding=utf-8")["messages"]
    assert [m["text"] for m in peeked] == ["hello from the console"]
    page.click("#peek button[type=submit]")
    expect(page.locator("#messages tbody tr")).to_have_count(1)
    expect(page.locator("#messages")).to_contain_text("hello from the console")
    # the config: change one field through the form, see it through the API
    page.fill("#config input[name=max_messages]", "777")
    page.click("#config button[type=submit]")
    expect(page.locator("#config-msg")).to_have_text("Saved: max_messages.")  # (only it)
    assert api(cluster, "GET", f"/topics/{topic}")["config"]["max_messages"] == 777
    # and a group's config, in its own (collapsed) editor
    page.click("#group-configs details[data-group=default] summary")
    page.fill("#group-config-default input[name=visibility_timeout]", "45")
    page.click("#group-config-default button[type=submit]")
    expect(page.locator("#group-config-msg")).to_have_text("Saved: visibility_timeout.")
    expect(page.locator("#group-configs details[data-group=default]")).to_have_attribute("open", "")
    group = api(cluster, "GET", f"/topics/{topic}/groups/default")
    assert group["config"]["visibility_timeout"] == 45
    console.shot("topic")
    console.check()


def test_messages_a_consumer_process_holds_show_in_flight(
    console: Console, cluster: Cluster
) -> None:
    topic = _name("held")
    work = {"group": "work", "config": {"visibility_timeout": 300}}
    api(cluster, "POST", "/topics", {"topic": topic, "groups": [work]})
    publish(cluster, topic, 5)
    env = dict(os.environ, RAFTQ_TOKEN=ADMIN_TOKEN)
    out = subprocess.run(
        [sys.executable, "-m", "raftq.node", "receive", topic, "--group", "work", "--max", "3",
         "--url", cluster.url("n2")],
        capture_output=True, text=True, timeout=60, env=env, check=True,
    )  # fmt: skip
    assert len(out.stdout.splitlines()) == 3
    console.sign_in(ADMIN_TOKEN)
    console.go(f"#/topic/{topic}")
    row = console.page.locator("#groups tr[data-group=work]")
    expect(row.locator("[data-col=in_flight]")).to_have_text("3")
    expect(row.locator("[data-col=pending]")).to_have_text("2")
    console.check()


def test_a_dead_letter_redrive_through_the_ui_moves_them_back(
    console: Console, cluster: Cluster
) -> None:
    topic = _name("dl")
    api(cluster, "POST", "/topics",
        {"topic": topic, "groups": [{"group": "g", "config": {"max_attempts": 1}}]})  # fmt: skip
    publish(cluster, topic, 2)
    got = api(cluster, "POST", f"/topics/{topic}/groups/g/receive", {"max": 2, "wait": 5})
    receipts = [d["receipt"] for d in got["deliveries"]]
    assert len(receipts) == 2
    api(cluster, "POST", "/nack", {"receipts": receipts})
    dlq = f"{topic}.dlq"
    wait_for("2 dead letters", lambda: api(cluster, "GET", f"/topics/{dlq}")["messages"] == 2, 10)
    console.sign_in(ADMIN_TOKEN)
    page = console.page
    console.go("#/dlq")
    page.click(f"#dlq-topics tr[data-topic='{dlq}'] a")
    expect(page.locator("#messages tbody tr")).to_have_count(2)
    expect(page.locator("#messages")).to_contain_text("x-raftq-dlq-")
    console.shot("dead-letters")
    page.click("#redrive")
    expect(page.locator("#confirm")).to_be_visible()
    console.shot("dead-letters-confirm")
    page.click("#confirm-ok")
    expect(page.locator("#dlq-detail .msg")).to_contain_text("Redriven 2")
    group = api(cluster, "GET", f"/topics/{topic}/groups/g")
    assert group["pending"] == 2, group
    console.check()


def test_tokens_are_created_once_shown_and_revoked_through_the_ui(
    console: Console, cluster: Cluster
) -> None:
    name = _name("tok")
    console.sign_in(ADMIN_TOKEN)
    page = console.page
    console.go("#/tokens")
    page.fill("#token-name", name)
    page.fill("#token-grants", "orders.*=consume,publish")
    page.click("#create-token button[type=submit]")
    secret = page.locator("#token-secret").inner_text()
    assert secret.startswith("rq_")
    assert http("GET", cluster.url("n1") + "/topics", token=secret)[0] == 200  # it works
    console.shot("tokens")
    page.locator(f"#token-list tr[data-token='{name}'] button").click()
    page.click("#confirm-ok")
    expect(page.locator(f"#token-list tr[data-token='{name}']")).to_have_count(0)
    assert http("GET", cluster.url("n1") + "/topics", token=secret)[0] == 401
    console.check()


def test_a_token_limited_to_one_topic_sees_only_that_topic(
    console: Console, cluster: Cluster
) -> None:
    mine, other = _name("mine"), _name("other")
    for t in (mine, other):
        api(cluster, "POST", "/topics", {"topic": t})
    publish(cluster, mine, 1)
    token = api(cluster, "POST", "/tokens", {
        "name": _name("narrow"), "grants": [{"topics": mine, "actions": ["publish", "consume"]}],
    })["token"]  # fmt: skip
    console.sign_in(token)
    page = console.page
    expect(page.locator("[data-total=topics] .value")).to_have_text("1")
    expect(page.locator("#nav-tokens")).to_be_hidden()
    console.go("#/topics")
    expect(page.locator("tbody tr")).to_have_count(1)
    expect(page.locator("tbody")).to_contain_text(mine)
    expect(page.locator("#create-topic button")).to_be_disabled()
    console.go(f"#/topic/{mine}")
    expect(page.locator("#publish button[type=submit]")).to_be_enabled()
    expect(page.locator("#peek button[type=submit]")).to_be_disabled()
    expect(page.locator("#config button[type=submit]")).to_be_disabled()
    console.shot("limited-token")
    console.check()


def test_a_token_revoked_while_signed_in_is_sent_back_to_sign_in(
    console: Console, cluster: Cluster
) -> None:
    console.allowed.append("status of 401")  # the poll after the revoke, on purpose
    made = api(cluster, "POST", "/tokens", {"name": _name("brief"), "grants": []})
    console.sign_in(made["token"])
    page = console.page
    expect(page.locator("#nodes tr")).to_have_count(3)  # (any token may see the cluster)
    api(cluster, "DELETE", f"/tokens/{made['id']}")
    expect(page.locator("form.signin .msg")).to_contain_text("Signed out", timeout=10_000)
    assert page.evaluate("sessionStorage.getItem('raftq.token')") is None
    console.check()


def test_every_page_renders_without_console_errors(console: Console, cluster: Cluster) -> None:
    topic = _name("pages")
    api(cluster, "POST", "/topics", {"topic": topic})
    console.sign_in(ADMIN_TOKEN)
    page = console.page
    for hash_, ready in (
        ("#/overview", "#nodes tr"),
        ("#/topics", f"tbody tr[data-key='{topic}']"),
        (f"#/topic/{topic}", "#groups tr[data-group=default]"),
        ("#/dlq", "#dlq-topics tr"),
        ("#/tokens", "#token-list tr"),
    ):
        console.go(hash_)
        page.locator(ready).first.wait_for()
        page.keyboard.press("r")  # (a refresh from the keyboard)
    # keyboard navigation between pages
    page.locator("main").focus()
    page.keyboard.press("t")
    expect(page.locator("nav a.active")).to_have_text("Topics")
    page.keyboard.press("o")
    expect(page.locator("nav a.active")).to_have_text("Overview")
    console.check()


def test_a_killed_node_shows_as_down_within_seconds(console: Console, cluster: Cluster) -> None:
    leader = cluster.leader()
    victim = next(n for n in ("n3", "n2") if n != leader)  # (the page talks to n1)
    console.sign_in(ADMIN_TOKEN)
    page = console.page
    expect(page.locator(f"#nodes tr[data-node={victim}] [data-up]")).to_have_text("up")
    t0 = time.monotonic()
    cluster.kill(victim)
    try:
        expect(page.locator(f"#nodes tr[data-node={victim}] [data-up]")).to_have_text(
            "down", timeout=8_000
        )
        shown_after = time.monotonic() - t0
        console.shot("node-down")
        print(f"{victim} shown down {shown_after:.1f} s after kill -9")
    finally:
        cluster.start_node(victim)
    expect(page.locator(f"#nodes tr[data-node={victim}] [data-up]")).to_have_text(
        "up", timeout=15_000
    )
    console.check()


def test_the_console_works_over_https(browser: Any, tmp_path: Path, shots: Path) -> None:
    """A cluster on HTTPS (a dev CA the browser is told to accept): the console signs in, and
    the node it talks to probes its peers over HTTPS for their figures."""
    from tests.node.test_tls_cluster import TlsCluster

    tls = TlsCluster(tmp_path, 3)
    ctx = browser.new_context(ignore_https_errors=True)  # (the dev CA is not the system's)
    try:
        tls.start()
        con = Console(ctx.new_page(), tls.url("n1"), shots)
        assert con.url.startswith("https://")
        con.sign_in(ADMIN_TOKEN)
        expect(con.page.locator("#nodes [data-up=up]")).to_have_count(3)
        expect(con.page.locator("#nodes")).to_contain_text("MiB")  # (the peers' figures too)
        assert con.page.locator("#nodes td:has-text('MiB')").count() == 3
        con.shot("overview-https")
        con.check()
    finally:
        ctx.close()
        tls.close()
