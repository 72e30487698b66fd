"""The environment's API client: spooled groups reach the API once, even when closing mid-flush."""

from __future__ import annotations

import asyncio
import json
import logging
import os

import pytest

from atroposlib.delivery_ledger import DELIVERED_LEDGER
from atroposlib.envs.api_client import APIRefusedError, StateDirInUse, TrajectoryClient
from atroposlib.protocol import GROUP_ID_FIELD, WEIGHT_VERSIONS_FIELD
from atroposlib.utils.ports import free_port
from atroposlib.utils.waiting import poll_until_async
from tests.support.groups import make_group, register_env, start_trainer
from tests.support.processes import ApiProcess


def test_close_while_the_background_flusher_runs(api, wire_client, tmp_path):
    start_trainer(wire_client, batch_size=4)

    async def produce() -> int:
        trajectories = TrajectoryClient(api.url, tmp_path / "spool")
        for tag in range(20):
            trajectories.send([make_group(2, tag=tag + 3)])
        await asyncio.sleep(0)  # let the background flusher start delivering
        await trajectories.close()  # flushes the rest concurrently with it
        return trajectories.pending()

    assert asyncio.run(produce()) == 0
    status = wire_client.get("/status").json()
    assert status["queued_sequences"] == 40, "every group arrives exactly once"


def test_a_refused_group_is_logged_and_dead_lettered(api, wire_client, tmp_path, caplog):
    """A 4xx is final, but the group is kept beside the spool with the API's answer."""
    start_trainer(wire_client, batch_size=4)
    malformed = {**make_group(2, tag=7), "masks": [[1, 2]]}  # one mask row for two sequences

    async def produce() -> TrajectoryClient:
        trajectories = TrajectoryClient(api.url, tmp_path / "state" / "spool")
        trajectories.send([malformed])
        trajectories.send([make_group(2, tag=8)])
        await trajectories.close()
        return trajectories

    with caplog.at_level(logging.INFO, logger="atroposlib.envs"):
        trajectories = asyncio.run(produce())
    assert trajectories.pending() == 0
    assert dict(trajectories.counters) == {"rejected_422": 1, "groups_delivered": 1}
    dead = tmp_path / "state" / "dead-letter.jsonl"
    lines = [json.loads(line) for line in dead.read_text().splitlines()]
    assert len(lines) == 1
    assert lines[0]["status"] == 422 and lines[0]["path"] == "/scored_data"
    payload = lines[0]["payload"]
    assert {k: v for k, v in payload.items() if k != GROUP_ID_FIELD} == malformed
    assert payload[GROUP_ID_FIELD] and lines[0]["key"]
    answer = json.loads(lines[0]["answer"])
    assert answer["detail"], answer
    errors = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and r.name.startswith("atroposlib")
    ]
    assert len(errors) == 1, errors
    assert "422" in errors[0] and lines[0]["answer"][:200] in errors[0]
    assert str(dead) in errors[0], "the log says where the group went"
    assert wire_client.get("/status").json()["queued_sequences"] == 2, (
        "the next group still arrives"
    )


def test_resuming_a_spool_warns_with_count_and_path(tmp_path, caplog):
    spool = tmp_path / "spool"
    spool.mkdir()
    for number in range(3):
        record = {"path": "/scored_data", "key": f"k{number}", "payload": make_group(2)}
        (spool / f"{number:012d}.json").write_text(json.dumps(record))

    async def open_client() -> None:
        await TrajectoryClient("http://127.0.0.1:9", spool).http.aclose()

    with caplog.at_level(logging.INFO, logger="atroposlib.envs"):
        asyncio.run(open_client())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("3" in m and str(spool) in m for m in warnings), warnings


@pytest.mark.integration  # the first owner's flusher knocks on a closed loopback port
def test_a_second_owner_of_a_spool_is_refused_until_the_first_is_gone(tmp_path):
    """DUR-2 of the security review: two copies of one env in one directory shared its
    spool, and the second's group replaced the first's file. The second is refused now,
    with words that say what to do; the first's group stays; once the first closes (or
    dies), the spool is free."""
    spool = tmp_path / "state" / "spool"

    async def run() -> None:
        first = TrajectoryClient("http://127.0.0.1:9", spool)
        first.send([make_group(2, tag=1)])
        with pytest.raises(StateDirInUse) as refused:
            TrajectoryClient("http://127.0.0.1:9", spool)
        message = str(refused.value)
        assert f"pid {os.getpid()}" in message and "ATROPOS_ENV_STATE_DIR" in message
        (kept,) = sorted(spool.glob("*.json"))
        assert json.loads(kept.read_text())["payload"]["tokens"] == make_group(2, tag=1)["tokens"]
        await first.close(flush_timeout_s=0.1)
        second = TrajectoryClient("http://127.0.0.1:9", spool)
        assert second.pending() == 1, "the first's group waits for the next owner"
        await second.close(flush_timeout_s=0.1)

    asyncio.run(run())


def test_status_env_polls_and_a_refusal_is_one_clear_error(api, wire_client, tmp_path):
    """Our API reads env_id from the body or the query; an env it does not know is a 404
    that stops the env with the API's words, not an HTTPStatusError traceback."""
    start_trainer(wire_client, batch_size=4)
    env_id = register_env(wire_client, group_size=2)["env_id"]

    async def poll() -> tuple[dict, str, str]:
        trajectories = TrajectoryClient(api.url, tmp_path / "spool")
        try:
            status = await trajectories.status_env(env_id)
            with pytest.raises(APIRefusedError) as unknown:
                await trajectories.status_env(env_id + 5)
            with pytest.raises(APIRefusedError) as not_json:
                await trajectories.get_json("/reset_data")  # answers plain text
            return status, str(unknown.value), str(not_json.value)
        finally:
            await trajectories.close()

    status, unknown, not_json = asyncio.run(poll())
    assert status["current_step"] == 0 and status["env_weight"] == pytest.approx(1.0)
    assert unknown.startswith("GET /status-env was refused") and "HTTP 404" in unknown
    assert f"unknown env_id {env_id + 5}" in unknown and "no longer knows this env" in unknown
    assert "not JSON" in not_json and "Reset successful" in not_json


def test_each_group_gets_an_id_and_each_acknowledged_post_a_ledger_line(api, wire_client, tmp_path):
    """Ids survive the trip to the trainer; a post answered again (its key replayed after
    a crash between the 200 and the spool cleanup) adds no group and no new id."""
    start_trainer(wire_client, batch_size=4)
    spool = tmp_path / "state" / "spool"

    async def produce(groups: list[list[dict]]) -> TrajectoryClient:
        trajectories = TrajectoryClient(api.url, spool)
        for posted in groups:
            trajectories.send(posted)
        await trajectories.close()
        return trajectories

    spooled: list[dict] = []
    original_deliver = TrajectoryClient._deliver

    async def keep_a_copy(self, record, body=None):  # what a crash before the unlink leaves
        spooled.append(record)
        await original_deliver(self, record, body)

    TrajectoryClient._deliver = keep_a_copy
    try:
        asyncio.run(produce([[make_group(2, tag=1)], [make_group(2, tag=2), make_group(2, tag=3)]]))
    finally:
        TrajectoryClient._deliver = original_deliver
    ledger = tmp_path / "state" / DELIVERED_LEDGER
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    ids = [i for line in lines for i in line["group_ids"]]
    assert len(ids) == 3 == len(set(ids)) and all(isinstance(i, str) and i for i in ids)
    assert [line["key"] for line in lines] == [record["key"] for record in spooled]

    (spool / "000000000099.json").write_text(json.dumps(spooled[1]))
    asyncio.run(produce([]))
    replayed = [json.loads(line) for line in ledger.read_text().splitlines()][-1]
    assert replayed["key"] == spooled[1]["key"] and replayed["group_ids"] == ids[1:]
    assert wire_client.get("/status").json()["queued_sequences"] == 6, "the replay queued nothing"
    served = wire_client.get("/batch").json()["batch"]  # 2 of the 3 groups make a batch of 4
    assert [group[GROUP_ID_FIELD] for group in served] == ids[:2]


def test_an_unreadable_spool_file_is_dead_lettered_and_delivery_goes_on(
    api, wire_client, tmp_path, caplog
):
    """ENV-1: an empty spool file (a power loss can leave one) raised JSONDecodeError in
    the flusher, which then died on every later send: nothing was delivered again."""
    start_trainer(wire_client, batch_size=4)
    spool = tmp_path / "state" / "spool"
    spool.mkdir(parents=True)
    (spool / f"{0:012d}.json").write_bytes(b"")  # cut short before a byte was written
    record = {"path": "/scored_data", "key": "k1", "payload": make_group(2, tag=5)}
    (spool / f"{1:012d}.json").write_text(json.dumps(record))

    async def deliver() -> TrajectoryClient:
        trajectories = TrajectoryClient(api.url, spool)
        trajectories.send([make_group(2, tag=6)])
        await trajectories.close()
        return trajectories

    with caplog.at_level(logging.INFO, logger="atroposlib.envs"):
        trajectories = asyncio.run(deliver())
    assert trajectories.pending() == 0
    assert trajectories.counters["unreadable_spool_files"] == 1
    assert trajectories.counters["groups_delivered"] == 2
    (dead,) = [json.loads(line) for line in (tmp_path / "state" / "dead-letter.jsonl").open()]
    assert dead["spool_file"] == f"{0:012d}.json" and dead["raw"] == ""
    assert "unreadable spool file" in dead["error"]
    assert wire_client.get("/status").json()["queued_sequences"] == 4


def test_the_client_remembers_the_newest_weight_version_it_sent(tmp_path):
    """Numeric labels only (digit strings, as the trainer reads them): None, other labels
    and groups without versions leave it as it was; it never goes down."""

    async def send_all() -> list[int | None]:
        trajectories = TrajectoryClient("http://127.0.0.1:9", tmp_path / "spool")
        seen = [trajectories.newest_weight_version]
        for groups in (
            [make_group(2, tag=1)],
            [{**make_group(2, tag=2), WEIGHT_VERSIONS_FIELD: [None, "base"]}],
            [{**make_group(2, tag=3), WEIGHT_VERSIONS_FIELD: ["3", None]}],
            [
                {**make_group(2, tag=4), WEIGHT_VERSIONS_FIELD: ["12", "7"]},
                {**make_group(2, tag=5), WEIGHT_VERSIONS_FIELD: ["9", "-1"]},
            ],
            [{**make_group(2, tag=6), WEIGHT_VERSIONS_FIELD: ["10", "²"]}],
        ):
            trajectories.send(groups)
            assert trajectories._flusher is not None
            trajectories._flusher.cancel()  # unit tier: nothing is posted
            seen.append(trajectories.newest_weight_version)
        await trajectories.http.aclose()
        assert trajectories.pending() == 5
        return seen

    assert asyncio.run(send_all()) == [None, None, None, 3, 12, 12]


@pytest.mark.integration
def test_a_dead_api_is_named_once_with_what_to_check_and_its_return_once(tmp_path, caplog):
    """Not one line per try and not silent: the first failure names the URL and what to
    check; the API that then starts there is reported once, with the tries it took."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    api = ApiProcess(tmp_path / "state", port=port)

    async def scenario() -> tuple[dict, int]:
        trajectories = TrajectoryClient(url, tmp_path / "spool", max_backoff_s=0.1)
        asking = asyncio.create_task(trajectories.get_json("/info"))
        notes = trajectories._notes("GET", "/info")
        await poll_until_async(lambda: notes.failures >= 5, 60, "five failed tries")
        failed = notes.failures
        await asyncio.to_thread(api.start)
        info = await asking
        await trajectories.close()
        return info, failed

    try:
        with caplog.at_level(logging.INFO, logger="atroposlib.envs"):
            info, failed = asyncio.run(scenario())
    finally:
        api.stop()
    assert info == {"batch_size": -1, "max_token_len": -1}
    lines = [r for r in caplog.records if "GET /info" in r.getMessage()]
    warning, back = (r.getMessage() for r in lines)  # exactly two lines for the outage
    assert warning.startswith(f"GET /info to the trajectory API at {url} failed (")
    assert f"check that run-api is running at {url}" in warning
    assert "--env.rollout_server_url" in warning
    assert back.startswith(f"GET /info to the trajectory API at {url} answered after ")
    tries = int(back.split(" and ")[-1].split()[0])
    assert tries >= failed >= 5


async def test_a_held_status_waits_for_the_trainer_or_its_wait(api, wire_client, tmp_path):
    """An env with nothing to do asks /status-env to hold until a batch is taken."""
    start_trainer(wire_client, batch_size=4)
    env_id = register_env(wire_client)["env_id"]
    trajectories = TrajectoryClient(api.url, tmp_path / "spool")
    try:
        trajectories.hold_next_status(after_step=0, seconds=0.6)
        started = asyncio.get_running_loop().time()
        status = await trajectories.status_env(env_id)
        waited = asyncio.get_running_loop().time() - started
        assert status["current_step"] == 0 and 0.5 <= waited < 5.0
        assert trajectories.holds_status
        started = asyncio.get_running_loop().time()
        await trajectories.status_env(env_id)  # the hold is for one call only
        assert asyncio.get_running_loop().time() - started < 0.5
    finally:
        await trajectories.close()
