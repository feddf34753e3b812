"""Grid Engine, pure: the job script, what qsub and qstat print, what a job was granted."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from apportion.cli.main import main
from apportion.core.resources import SCALE
from apportion.deploy.allocator import (
    ENDED,
    QUEUED,
    RUNNING,
    STUCK,
    Allocator,
    Cancel,
    JobState,
    Report,
)
from apportion.deploy.sge_env import (
    NotInSGEJob,
    SGEGrant,
    grant_note,
    grant_supply,
    host_slots,
    memory_bytes,
    parse_complexes,
    parse_pe_hostfile,
    parse_resource_list,
    sge_grant,
    sge_job,
)
from apportion.deploy.sge_plan import (
    PESettings,
    WorkerPlan,
    default_scheduler_file,
    ignoring_notify,
    parse_pe,
    plan_workers,
    qrsh_environment,
    worker_command,
)
from apportion.deploy.sge_template import (
    SGEJobTemplate,
    h_rt,
    parse_qstat,
    parse_qsub_job_id,
    sge_phase,
)
from apportion.deploy.slurm_plan import LaunchOptions
from apportion.net.scheduler_file import write_scheduler_file

pytestmark = pytest.mark.timeout(10)

#: What ``qstat -j`` prints of a job (Son of Grid Engine 8.1.9), cut short.
QSTAT_J = """\
==============================================================
job_number:                 7
owner:                      ada
hard resource_list:         gpu=1,h_vmem=2G,h_rt=600
parallel environment:  smp range: 2
"""

#: ``qconf -sc``, the lines that matter.
QCONF_SC = """\
#name               shortcut   type      relop requestable consumable default  urgency
#--------------------------------------------------------------------------------------
h_vmem              h_vmem     MEMORY    <=    YES         NO         0        0
gpu                 gpu        INT       <=    YES         JOB        0        0
ngpus               ng         INT       <=    YES         YES        0        0
# >#< starts a comment but comments are not saved across edits --------
"""

QSTAT = """\
job-ID  prior   name       user         state submit/start at     queue          slots ja-task-ID
-----------------------------------------------------------------------------------------------
     12 0.55500 apportion- ada          r     11/27/2026 17:00:36 all.q@node1        2
     13 0.00000 apportion- ada          qw    11/27/2026 17:00:40                    1
     14 0.00000 apportion- ada          Eqw   11/27/2026 17:00:41                    1
     15 0.00000 array      ada          r     11/27/2026 17:00:42 all.q@node1        1 1
     15 0.00000 array      ada          qw    11/27/2026 17:00:42                    1 2-4:1
"""


# --- the job script -----------------------------------------------------------------------


def gpu_template(**extra: object) -> SGEJobTemplate:
    fields: dict[str, object] = {
        "name": "gpu",
        "cores": 2,
        "pe": "smp",
        "memory": "4GiB",
        "gpus": 1,
        "walltime": "30:00",
        "queue": "gpu.q",
        "project": "ml",
        "resource_spec": "scratch=10G",
        "log_directory": "/shared/logs",
        "job_extra_directives": ["-l arch=lx-amd64"],
    }
    fields.update(extra)
    return SGEJobTemplate(**fields)  # type: ignore[arg-type]


def test_the_script_asks_grid_engine_for_what_the_template_says() -> None:
    script = gpu_template().script("/shared/scheduler.json", {"APPORTION_TLS_CA": "/s/ca.pem"})
    directives = [line[3:] for line in script.splitlines() if line.startswith("#$ ")]
    assert directives == [
        "-N apportion-gpu",
        "-S /bin/sh",
        "-cwd",
        "-j y",
        "-o /shared/logs/$JOB_NAME-$JOB_ID.out",
        "-l h_rt=0:30:00",
        "-pe smp 2",
        "-l h_vmem=2048M",  # per slot: Grid Engine's limits are per slot
        "-l gpu=1",
        "-l scratch=10G",
        "-q gpu.q",
        "-P ml",
        "-l arch=lx-amd64",
        "-notify",
    ]
    assert "export APPORTION_TLS_CA=/s/ca.pem" in script
    # The worker is named after the job, offers the grant, and drains on qdel's warning.
    assert "--name sge-${JOB_ID} " in script
    assert "--resources sge " in script
    assert "trap '' USR2" in script
    assert "trap 'kill -TERM \"$worker\" 2>/dev/null' USR2 TERM" in script


def test_the_shape_is_what_the_workers_will_offer() -> None:
    shape = gpu_template().shape()
    assert shape.nthreads == 2
    assert shape.supply == {"cpus": 2 * SCALE, "memory": 4 * 2**30 * SCALE, "gpu": SCALE}


def test_the_same_allocator_plans_grid_engine_jobs_and_cancels_one_in_error() -> None:
    allocator = Allocator([SGEJobTemplate(name="cpu").shape(), gpu_template().shape()])
    allocator.adapt(allocator.policy)
    allocator.submitted(0, "gpu", "12")
    allocator.submitted(0, "cpu", "14")
    out = allocator.step(1, [], [], parse_qstat(QSTAT))
    assert [c.job for c in out if isinstance(c, Cancel)] == ["14"]  # Eqw: never runs
    assert any("cpu job 14 is held in state Eqw" in c.text for c in out if isinstance(c, Report))
    assert allocator.jobs["12"].state == "running"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cores": 4}, "4 cores need a parallel environment"),
        ({"cores": 1, "account": "a"}, "give project="),
        ({"cores": 1, "pe": "smp; rm"}, "not a Grid Engine name"),
        ({"cores": 1, "walltime": "1h"}, "walltime"),
    ],
)
def test_a_template_grid_engine_would_refuse_is_refused_here(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        SGEJobTemplate(name="x", **fields)  # type: ignore[arg-type]


def test_walltime_becomes_h_rt() -> None:
    assert h_rt("01:30:00") == "1:30:00"
    assert h_rt("2-00:00:00") == "48:00:00"
    assert h_rt("45") == "0:45:00"


# --- what qsub and qstat print -------------------------------------------------------------


def test_qsub_terse_prints_the_job_id() -> None:
    assert parse_qsub_job_id("123\n") == "123"
    assert parse_qsub_job_id("124.1-10:1\n") == "124"
    with pytest.raises(ValueError, match="qsub printed no job id"):
        parse_qsub_job_id("Unable to run job: denied\n")


def test_qstat_states_mean_phases() -> None:
    assert parse_qstat(QSTAT) == {
        "12": JobState(RUNNING, "r"),
        "13": JobState(QUEUED, "qw"),
        "14": JobState(STUCK, "Eqw"),
        "15": JobState(RUNNING, "r"),
    }
    assert parse_qstat("") == {}
    for word, phase in [("hqw", QUEUED), ("t", RUNNING), ("dr", RUNNING), ("Rr", RUNNING)]:
        assert sge_phase(word) == phase
    assert sge_phase("s") == QUEUED and sge_phase("z") == ENDED


# --- what the job was granted --------------------------------------------------------------


def job_env(**extra: str) -> dict[str, str]:
    return {"JOB_ID": "7", "SGE_TASK_ID": "undefined", "NSLOTS": "2", **extra}


def test_the_job_from_its_environment_and_pe_hostfile() -> None:
    job = sge_job(job_env(), "node1.cluster 2 all.q@node1 UNDEFINED\n", "node1")
    assert (job.job_id, job.task_id, job.slots, job.hosts) == (
        "7",
        None,
        2,
        (("node1.cluster", 2),),
    )
    assert host_slots(job, "node1") == 2  # the short name matches
    alone = sge_job(job_env(SGE_TASK_ID="3"), None, "node9")
    assert alone.task_id == "3" and alone.hosts == (("node9", 2),)


def test_outside_a_job_and_malformed_values_are_one_line() -> None:
    with pytest.raises(NotInSGEJob, match="not inside a Grid Engine job"):
        sge_job({"JOB_ID": "7"}, None, "h")  # JOB_ID alone is not Grid Engine's
    with pytest.raises(ValueError, match="NSLOTS='two'"):
        sge_job(job_env(NSLOTS="two"), None, "h")
    with pytest.raises(ValueError, match="PE_HOSTFILE"):
        parse_pe_hostfile("node1\n")
    job = sge_job(job_env(), "a 1 q UNDEFINED\nb 1 q UNDEFINED\n", "c")
    with pytest.raises(ValueError, match=r"this host \(c\) is not among"):
        host_slots(job, "c")
    with pytest.raises(ValueError, match=r"this host \(c\) is not among"):
        plan_workers(job, "c", None, True, ["python"], LaunchOptions(), Path("/f"))


def test_the_grant_from_qstat_and_qconf() -> None:
    resources = parse_resource_list(QSTAT_J)
    assert resources == {"gpu": "1", "h_vmem": "2G", "h_rt": "600"}
    complexes = parse_complexes(QCONF_SC)
    assert complexes["ng"] == ("ngpus", "YES")
    grant = sge_grant({"CUDA_VISIBLE_DEVICES": "3"}, 2, resources, complexes)
    assert grant == SGEGrant(cpus=2, memory=4 * 2**30, gpus=1, gpu_labels=("3",))
    amounts, units = grant_supply(grant)
    assert amounts == {"cpus": 2 * SCALE, "memory": 4 * 2**30 * SCALE, "gpu": SCALE}
    assert units == {"gpu": ["3"]}
    assert grant_note(grant) is None


def test_a_per_slot_consumable_is_granted_once_per_slot_and_its_shortcut_counts() -> None:
    complexes = parse_complexes(QCONF_SC)
    grant = sge_grant({"SGE_HGR_ngpus": "0 1 2 3"}, 4, {"ng": "1"}, complexes, "ngpus")
    assert (grant.gpus, grant.gpu_labels) == (4, ("0", "1", "2", "3"))


def test_gpus_nothing_names_are_a_count_and_said_so() -> None:
    grant = sge_grant({}, 1, {"gpu": "2"}, parse_complexes(QCONF_SC))
    assert grant.gpu_labels == ()
    assert grant_supply(grant) == ({"cpus": SCALE, "gpu": 2 * SCALE}, {})
    assert "without naming the devices" in (grant_note(grant) or "")


def test_a_mask_that_disagrees_with_the_grant_is_refused() -> None:
    with pytest.raises(ValueError, match=r"names 2 device\(s\), and Grid Engine granted gpu=1"):
        sge_grant({"CUDA_VISIBLE_DEVICES": "0,1"}, 1, {"gpu": "1"}, parse_complexes(QCONF_SC))
    with pytest.raises(ValueError, match="lists no complex 'gpu'"):
        sge_grant({}, 1, {"gpu": "1"}, {})


def test_on_several_hosts_a_per_job_consumable_is_the_master_hosts_alone() -> None:
    complexes = parse_complexes(QCONF_SC)  # gpu: JOB; ngpus (ng): YES
    master = sge_grant({"CUDA_VISIBLE_DEVICES": "1"}, 2, {"gpu": "1"}, complexes)
    assert (master.gpus, master.gpu_labels) == (1, ("1",))
    # Grid Engine debits a JOB consumable from the master queue only.
    other = sge_grant({"CUDA_VISIBLE_DEVICES": "1"}, 2, {"gpu": "1"}, complexes, master=False)
    assert (other.gpus, other.gpu_labels) == (0, ())
    assert grant_supply(other) == ({"cpus": 2 * SCALE}, {})
    per_slot = sge_grant({}, 3, {"ng": "1"}, complexes, "ngpus", master=False)
    assert per_slot.gpus == 3  # one per slot on every host
    per_host = {"gpu": ("gpu", "HOST")}  # Univa/Altair's per-host consumable
    assert sge_grant({}, 3, {"gpu": "2"}, per_host, master=False).gpus == 2
    memory = sge_grant({}, 3, {"h_vmem": "1G"}, complexes, master=False).memory
    assert memory == 3 * 2**30  # h_vmem is per slot, on every host


def test_memory_sizes_in_grid_engines_units() -> None:
    assert memory_bytes("2G", "h_vmem") == 2 * 2**30
    assert memory_bytes("1.5g", "h_vmem") == 1_500_000_000
    assert memory_bytes("512", "h_vmem") == 512
    with pytest.raises(ValueError, match="h_vmem='lots'"):
        memory_bytes("lots", "h_vmem")


# --- apportion sge, planned ----------------------------------------------------------------


def test_the_worker_and_its_scheduler_file() -> None:
    job = sge_job(job_env(SGE_TASK_ID="4"), None, "node1")
    file = default_scheduler_file(job, Path("/work"))
    assert file == Path("/work/apportion-scheduler-7.4.json")  # one per array task
    options = LaunchOptions(nworkers_per_node=2, resources="licence=1", drain_timeout=5.0)
    argv = worker_command(["python"], options, file, "node1")
    assert argv == [
        *["python", "-m", "apportion.cli.main", "worker", "--scheduler-file", str(file)],
        *["--name", "node1", "--nworkers", "2", "--resources", "sge licence=1"],
        *["--drain-timeout", "5.0"],
    ]
    assert ignoring_notify(["a", "b c"]) == [
        "sh",
        "-c",
        'trap "" USR2; exec "$@"',
        "sh",
        "a",
        "b c",
    ]


#: What ``qconf -sp mpi`` prints (Son of Grid Engine 8.1.9).
QCONF_SP = """\
pe_name            mpi
slots              999
user_lists         NONE
xuser_lists        NONE
start_proc_args    NONE
stop_proc_args     NONE
allocation_rule    $fill_up
control_slaves     TRUE
job_is_first_task  TRUE
urgency_slots      min
accounting_summary FALSE
qsort_args         NONE
"""

HOSTFILE = """\
node1.cluster 1 all.q@node1.cluster UNDEFINED
node2.cluster 2 all.q@node2.cluster UNDEFINED
node3.cluster 3 all.q@node3.cluster UNDEFINED
"""

TIGHT = PESettings("mpi", control_slaves=True, job_is_first_task=True)


def plan(hostfile: str | None, hostname: str, pe: PESettings | None) -> WorkerPlan:
    job = sge_job(job_env(NSLOTS="6"), hostfile, hostname)
    options = LaunchOptions(resources="licence=1", drain_timeout=5.0)
    return plan_workers(job, hostname, pe, hostfile is not None, ["py"], options, Path("/f"))


def test_the_parallel_environments_settings_from_qconf() -> None:
    assert parse_pe("mpi", QCONF_SP) == TIGHT
    loose = QCONF_SP.replace("control_slaves     TRUE", "control_slaves     FALSE")
    assert parse_pe("mpi", loose).control_slaves is False
    with pytest.raises(ValueError, match="qconf -sp mpi: job_is_first_task is missing"):
        parse_pe("mpi", "pe_name mpi\ncontrol_slaves TRUE\n")


def test_every_host_of_a_tight_parallel_environment_starts_its_workers_through_qrsh() -> None:
    found = plan(HOSTFILE, "node1", TIGHT)
    assert found.warning is None and found.several_hosts and found.through_qrsh
    hosts = [(s.host, s.slots, s.qrsh) for s in found.starts]
    # The job script holds node1's one slot (job_is_first_task): its workers start
    # here, in that slot; the other hosts' through qrsh -inherit.
    assert hosts == [
        ("node1.cluster", 1, False),
        ("node2.cluster", 2, True),
        ("node3.cluster", 3, True),
    ]
    worker = [
        *["py", "-m", "apportion.cli.main", "worker", "--scheduler-file", "/f"],
        *["--name", "node2.cluster", "--nworkers", "1", "--resources", "sge licence=1"],
        *["--drain-timeout", "5.0"],
    ]
    qrsh = ["qrsh", "-inherit", "-V", "node2.cluster", "py", "-m", "apportion.deploy.sge_task"]
    assert list(found.starts[1].argv) == ignoring_notify([*qrsh, "--own-address", "--", *worker])
    local = worker_command(
        ["py"], LaunchOptions(resources="licence=1", drain_timeout=5.0), Path("/f"), "node1.cluster"
    )
    assert list(found.starts[0].argv) == ignoring_notify(local)


def test_the_master_host_goes_through_qrsh_when_a_slot_is_free_there() -> None:
    one = "node1 2 all.q@node1 UNDEFINED\n"
    (start,) = plan(one, "node1", TIGHT).starts  # 2 slots, one the job script's
    assert start.qrsh and "--own-address" not in start.argv  # one host: loopback
    (start,) = plan("node1 1 q UNDEFINED\n", "node1", TIGHT).starts
    assert not start.qrsh
    not_first = PESettings("mpi", control_slaves=True, job_is_first_task=False)
    (start,) = plan("node1 1 q UNDEFINED\n", "node1", not_first).starts
    assert start.qrsh  # the job script's slot is one more than the PE_HOSTFILE's


def test_without_control_slaves_the_workers_start_on_this_host_only_and_it_is_said() -> None:
    loose = PESettings("mpi", control_slaves=False, job_is_first_task=True)
    found = plan(HOSTFILE, "node1", loose)
    assert [(s.host, s.qrsh) for s in found.starts] == [("node1.cluster", False)]
    assert not found.several_hosts
    assert found.warning == (
        "parallel environment mpi has control_slaves FALSE, so qrsh -inherit cannot start "
        "workers on the job's other hosts: workers on node1.cluster only (1 of 6 slots); "
        "ask for a parallel environment with control_slaves TRUE (qconf -mp mpi)"
    )
    # On one host there is nothing given up, and nothing to say.
    assert plan("node1 2 q UNDEFINED\n", "node1", loose).warning is None


def test_a_job_outside_a_pe_or_an_unknown_pe_starts_here_what_it_can() -> None:
    (alone,) = plan(None, "node9", None).starts  # no PE_HOSTFILE: nothing to inherit
    assert (alone.host, alone.slots, alone.qrsh) == ("node9", 6, False)
    unknown = plan(HOSTFILE, "node1", None)  # qconf -sp could not be asked
    assert [s.qrsh for s in unknown.starts] == [False, True, True]


def test_qrsh_hands_the_tasks_no_credential() -> None:
    environ = {"PATH": "/bin", "APPORTION_TOKEN": "t", "APPORTION_TLS_KEY": "k"}
    assert qrsh_environment(environ, ("APPORTION_TOKEN", "APPORTION_TLS_KEY")) == {"PATH": "/bin"}


# --- the command lines ---------------------------------------------------------------------


def test_apportion_sge_outside_a_job_exits_2_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOB_ID", raising=False)
    result = CliRunner().invoke(main, ["sge", "--", "python", "script.py"])
    assert result.exit_code == 2
    assert result.output.startswith("Error: not inside a Grid Engine job (JOB_ID and SGE_TASK_ID")
    assert len(result.output.splitlines()) == 1


def test_alloc_sge_dry_run_prints_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPORTION_HOME", str(tmp_path / "home"))
    file = tmp_path / "scheduler.json"
    write_scheduler_file(file, "tcp://10.0.0.1:8786", "t" * 32, "s")
    result = CliRunner().invoke(
        main,
        [
            *["alloc", "sge", "--scheduler-file", str(file), "--cores", "4", "--pe", "smp"],
            *["--gpus", "1", "--gpu-resource", "cuda", "--queue", "gpu.q", "--walltime", "30:00"],
            *["--log-directory", str(tmp_path / "logs"), "--dry-run", "--", "-l arch=lx-amd64"],
        ],
    )
    assert result.exit_code == 0, result.output
    for line in ("#$ -pe smp 4", "#$ -l cuda=1", "#$ -q gpu.q", "#$ -l h_rt=0:30:00"):
        assert line in result.output.splitlines()
    assert "#$ -l arch=lx-amd64" in result.output
    assert "t" * 32 not in result.output
    refused = CliRunner().invoke(
        main, ["alloc", "sge", "--scheduler-file", str(file), "--cores", "4", "--dry-run"]
    )
    assert refused.exit_code == 1 and "need a parallel environment" in refused.output


def test_a_grant_grid_engine_cannot_be_asked_for_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from apportion.deploy.sge_query import current_grant

    monkeypatch.setenv("PATH", str(tmp_path))  # no qstat here
    with pytest.raises(ValueError, match=r"^qstat -j 7: .*qstat"):
        current_grant(job_env())
    hostfile = tmp_path / "absent"
    with pytest.raises(ValueError, match=f"PE_HOSTFILE={hostfile}: No such file"):
        current_grant(job_env(PE_HOSTFILE=str(hostfile)))


def test_a_cluster_takes_templates_of_its_own_batch_system_only(tmp_path: Path) -> None:
    from apportion import JobTemplate, SGECluster, SlurmCluster

    # Refused before anything starts: no scheduler, no file in the log directory.
    with pytest.raises(TypeError, match="templates of one batch system only"):
        SlurmCluster(templates=[SGEJobTemplate(name="gpu")], log_directory=tmp_path / "s")
    with pytest.raises(TypeError, match="JobTemplate, SGEJobTemplate"):
        SGECluster(templates=[JobTemplate(name="gpu")], log_directory=tmp_path / "g")
    assert not list(tmp_path.iterdir())
