"""API-4 of the correctness review: loopback is no trust boundary.

Any web page a local browser opens can send "simple" cross-site requests to
127.0.0.1 (a `text/plain` or form POST, which needs no CORS preflight), and a page
whose own name it rebinds to 127.0.0.1 can read the answers. Such requests must
change nothing: every POST must be JSON, and without a key the Host header must be
localhost, an IP address or an --allowed-hosts name.
"""

from __future__ import annotations

import json

import pytest

from atroposlib.utils.request_guard import host_allowed, host_name
from tests.support.groups import REGISTRATION, make_group
from tests.support.inprocess_api import inprocess_api

REBOUND = {"Host": "rebind.attacker.example"}


@pytest.fixture
def running(tmp_path):
    with inprocess_api(tmp_path / "state") as client:
        assert client.post("/register", json=REGISTRATION).status_code == 200
        assert client.post("/scored_data", json=make_group(4, tag=1)).status_code == 200
        yield client


def queued(client) -> int:
    return client.get("/status").json()["queue_size"]


@pytest.mark.parametrize(
    ("path", "content_type", "body"),
    [
        ("/scored_data", "text/plain", b'{"tokens": [[1]]}'),
        ("/scored_data", "application/x-www-form-urlencoded", b"tokens=1"),
        ("/scored_data", None, b"{}"),
        ("/reset_data", "text/plain", b""),
        ("/reset_data", "multipart/form-data; boundary=x", b"--x--"),
        ("/reset_data", None, b""),
        ("/register", "text/plain", b"{}"),
    ],
)
def test_a_post_that_is_not_json_changes_nothing(running, path, content_type, body):
    headers = {"Content-Type": content_type} if content_type else {}
    before = running.get("/info").json(), queued(running)
    response = running.post(path, content=body, headers=headers)
    assert response.status_code == 415, response.text
    assert "Content-Type: application/json" in response.json()["detail"]
    assert (running.get("/info").json(), queued(running)) == before


def test_json_in_any_of_its_spellings_is_taken(running):
    for content_type in ("application/json", "application/json; charset=utf-8", "Application/JSON"):
        response = running.post(
            "/scored_data",
            content=json.dumps(make_group(4, tag=2)),
            headers={"Content-Type": content_type},
        )
        assert response.status_code == 200, (content_type, response.text)
    assert running.post("/reset_data", json={}).text == "Reset successful"


@pytest.mark.parametrize("path", ["/status", "/batch", "/latest_example", "/reset_data"])
def test_a_foreign_host_reads_and_changes_nothing(running, path):
    before = queued(running)
    response = running.get(path, headers=REBOUND)
    assert response.status_code == 400
    detail = response.json()["detail"]
    assert "rebind.attacker.example" in detail and "--allowed-hosts" in detail
    assert queued(running) == before == 1
    post = running.post("/scored_data", json=make_group(4), headers=REBOUND)
    assert post.status_code == 400 and queued(running) == 1


@pytest.mark.parametrize("path", ["/batch", "/reset_data"])
def test_another_sites_image_takes_no_batch_and_wipes_nothing(running, path):
    """API-B of the security review: a page's `<img src="http://127.0.0.1:8000/batch">`
    is addressed to an IP, so the Host check passes it, and a keyless run-api handed it
    a batch (a GET that changes state). A browser marks such a request with
    `Sec-Fetch-Site`, and run-api refuses it before anything runs."""
    before = queued(running), running.get("/info").json()
    image = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}
    for site in ("cross-site", "same-site"):
        response = running.get(path, headers={**image, "Sec-Fetch-Site": site})
        assert response.status_code == 403 and "another site's page" in response.text
    assert (queued(running), running.get("/info").json()) == before
    assert running.get("/status", headers={"Sec-Fetch-Site": "none"}).status_code == 200


def test_health_answers_any_host(running):
    """Probes (a load balancer, Kubernetes) address it by whatever name they have."""
    assert running.get("/health", headers=REBOUND).status_code == 200
    assert running.get("/", headers=REBOUND).status_code == 200


def test_allowed_hosts_and_a_key_let_a_named_host_in(tmp_path):
    with inprocess_api(tmp_path / "a", allowed_hosts="api.internal, rebind.attacker.example") as c:
        assert c.get("/status", headers=REBOUND).status_code == 200
        assert c.get("/status", headers={"Host": "API.internal:8000"}).status_code == 200
        assert c.get("/status", headers={"Host": "other.example"}).status_code == 400
    with inprocess_api(tmp_path / "b", api_key="k") as keyed:  # the key is the check
        auth = {**REBOUND, "Authorization": "Bearer k"}
        assert keyed.get("/status", headers=auth).status_code == 200
        assert keyed.post("/reset_data", content=b"", headers=auth).status_code == 415


@pytest.mark.parametrize(
    ("header", "name"),
    [
        (b"127.0.0.1:8000", "127.0.0.1"),
        (b"[::1]:8000", "::1"),
        (b"[::1]", "::1"),
        (b"localhost", "localhost"),
        (b"LocalHost:80", "localhost"),
        (b"localhost.", "localhost"),
        (b"Example.COM:443", "example.com"),
    ],
)
def test_host_names(header, name):
    assert host_name(header) == name


@pytest.mark.parametrize(
    ("name", "allowed"),
    [
        ("127.0.0.1", True),
        ("10.1.2.3", True),  # an address: never a rebinding page's own name
        ("::1", True),
        ("localhost", True),
        ("app.localhost", True),
        ("localhost.attacker.example", False),
        ("127.0.0.1.nip.io", False),
        ("", False),
    ],
)
def test_which_names_pass_without_a_list(name, allowed):
    assert host_allowed(name, frozenset()) is allowed


def test_the_document_lists_the_refusals(running):
    paths = running.get("/openapi.json").json()["paths"]
    assert "415" in paths["/scored_data"]["post"]["responses"]
    assert "415" in paths["/reset_data"]["post"]["responses"]
    assert "415" not in paths["/status"]["get"]["responses"]
    assert "Host" in paths["/status"]["get"]["responses"]["400"]["description"]
