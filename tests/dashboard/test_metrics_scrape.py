"""/metrics over real TCP from a scheduler with a worker: the bearer token is what lets
a scraper in, and what it reads parses as Prometheus's text format."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from apportion import Client, LocalCluster
from apportion.cli.main import main
from apportion.dashboard.auth import metrics_token
from apportion.net import security as sec
from apportion.net.security import Security

pytestmark = pytest.mark.tcp


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(
        n_workers=1,
        threads_per_worker=2,
        processes=False,
        resources="gpu=[0,1]",
        dashboard_address="127.0.0.1:0",
    ) as cluster:
        yield cluster


def square(x: int) -> int:
    return x * x


def scrape(url: str, authorization: str | None) -> tuple[int, str, str]:
    request = urllib.request.Request(url)
    if authorization is not None:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.headers["Content-Type"], refused.read().decode()


def test_a_scraper_with_the_token_reads_the_cluster(cluster: LocalCluster) -> None:
    with Client(cluster) as client:
        assert client.gather(client.map(square, range(3), resources={"gpu": 1})) == [0, 1, 4]
        url = client.scheduler_info()["dashboard"] + "/metrics"
    token = metrics_token(cluster.scheduler.security.key())
    status, content_type, text = scrape(url, f"Bearer {token}")
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("apportion_resource_total", (("pool", "gpu"), ("worker", "worker-0")))] == 2
    assert samples[("apportion_worker_threads", (("worker", "worker-0"),))] == 2
    assert samples[("apportion_tasks_done_total", (("group", "square"),))] == 3
    count = ("apportion_task_duration_seconds_count", (("group", "square"),))
    assert samples[count] == 3
    assert samples[("apportion_event_loop_lag_seconds", ())] >= 0
    assert not any(name == "apportion_runs" for name, _ in samples)  # no journal served

    for refused in (None, "Bearer wrong", f"Basic {token}"):
        status, _, text = scrape(url, refused)
        assert status == 401 and "apportion token --metrics" in text


def test_apportion_token_prints_the_metrics_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = Security.temporary().token
    assert secret is not None
    monkeypatch.setenv("APPORTION_HOME", str(tmp_path))
    monkeypatch.delenv(sec.TOKEN_FILE_ENV, raising=False)
    monkeypatch.setenv(sec.TOKEN_ENV, secret)  # what a scheduler started here would use
    result = CliRunner().invoke(main, ["token", "--metrics"])
    assert result.exit_code == 0, result.output
    key = Security(token=secret, token_source=sec.TOKEN_ENV).key()
    assert result.stdout.strip() == metrics_token(key)
