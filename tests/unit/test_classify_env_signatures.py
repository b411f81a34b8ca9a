"""Issue 32's signatures: environment and version failures named with their versions, a GPU's own fatal PCIe
link, cloud preemption, and collective timeouts whose cause shows in the log (a busy rank, a desync).
Lines written in the formats the real threads of tests/unit/corpus/real show."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.classify import Classification, classify_paths, classify_text, load_rules
from trainguard.classify.engine import _component
from trainguard.errors import InputError

TIMEOUT = ("[rank{r}]:[E1130 07:41:02.1 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation "
           "timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn=8, NumelOut=8, Timeout(ms)=600000) ran for 600061 "
           "milliseconds before timing out.")


def _then_timeout(*lines: str, r: int = 1, seq: int = 3) -> Classification:
    """``lines``, then rank ``r``'s watchdog timeout: what the rank-local-work and cause-before-timeout cases read."""
    return classify_text("\n".join([*lines, TIMEOUT.format(r=r, seq=seq, op="ALLREDUCE")]), "k")


@pytest.mark.parametrize(("text", "named"), [
    ("UserWarning: NVIDIA H100 with CUDA capability sm_90 is not compatible with the current PyTorch installation.",
     "sm_90 is missing from the build"),
    ("RuntimeError: CUDA error: no kernel image is available for execution on the device", "no kernels"),
    ("RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version", "older than"),
    ("Jan 02 10:00:01 node-07 nv-fabricmanager[911]: fabric manager NVIDIA GPU driver interface version 550.90.07 "
     "don't match with driver version 550.127.05. Please update with matching NVIDIA driver package.",
     "Fabric Manager 550.90.07, driver 550.127.05"),
    ("node-07:81:90 [0] misc/shmutils.cc:112 NCCL WARN Error while creating shared memory segment "
     "/dev/shm/nccl-AbCdEf (size 9637888)", "/dev/shm"),
    ("node-07:81:90 [0] include/shm.h:28 NCCL WARN Call to posix_fallocate failed: No space left on device",
     "/dev/shm"),
    ("Exception: >- DeepSpeed Op Builder: Installed CUDA version 12.4 does not match the version torch was compiled "
     "with 11.8, unable to compile cuda/cpp extensions", "toolkit 12.4, torch built with 11.8"),
])
def test_environment_failures_are_dependencies_that_name_the_mismatch(text: str, named: str) -> None:
    c = classify_text(text, "x")
    assert c.category == "Dependency", c.explanation
    assert named in c.explanation


def test_detail_must_name_groups_of_the_pattern(tmp_path: object) -> None:
    from pathlib import Path
    f = Path(str(tmp_path)) / "r.toml"
    f.write_text("[[rule]]\nid = 'x'\ncategory = 'Dependency'\nconfidence = 0.5\npattern = 'a (?P<v>b)'\n"
                 "detail = '{w}'\n")
    with pytest.raises(InputError, match="detail names group"):
        load_rules(f)


def test_a_gpus_own_fatal_link_is_the_gpu_and_a_switch_with_two_gpus_below_is_the_board() -> None:
    own = "\n".join([
        "[  +0.000844] nvidia 0000:03:00.0: AER: can't recover (no error_detected callback)",
        "[  +0.000001] snd_hda_intel 0000:03:00.1: AER: can't recover (no error_detected callback)",
        "[  +0.000001] pcieport 0000:00:03.0: AER: Multiple Uncorrected (Fatal) error received: 0000:00:03.0",
        "[  +0.000921] nvidia 0000:03:00.0: AER: can't recover (no error_detected callback)",
        "[  +1.050439] pcieport 0000:00:03.0: AER: Root Port link has been reset (0)"])
    assert classify_text(own, "k").category == "Faulty GPU"
    switch = "\n".join([
        "[ 10.0] pcieport 0000:16:00.0: AER: Uncorrected (Fatal) error received: 0000:16:00.0",
        "[ 10.1] nvidia 0000:18:00.0: AER: can't recover (no error_detected callback)",
        "[ 10.1] nvidia 0000:1a:00.0: AER: can't recover (no error_detected callback)"])
    assert classify_text(switch, "k").category == "IO Expansion Board"


def test_functions_of_one_device_are_one_component() -> None:
    assert _component("0000:03:00.1") == _component("0000:03:00.0") == "0000:03:00"
    assert _component("0000:03:00") == "0000:03:00" and _component(None) is None


def test_an_elided_pci_address_still_gives_the_xid() -> None:
    c = classify_text("kernel: NVRM: Xid (PCI:...): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 11 (...)", "k")
    assert c.category == "Faulty GPU" and c.gpu is None


@pytest.mark.parametrize("line", [
    "Dec 17 16:03:58Z node-01 start-worker 2024/12/17 16:03:58 GCP Metadata Service says termination is imminent",
    "2025-03-31T16:32:36Z worker: EC2 Spot Instance Interruption Warning received for the instance",
    "Instance was preempted.",
    "slurmstepd: error: *** JOB 4242 ON node-01 CANCELLED AT 2026-06-18T13:05:36 DUE TO PREEMPTION ***",
])
def test_cloud_termination_is_host_maintenance_and_explains_the_timeouts(line: str) -> None:
    c = _then_timeout(line, r=3, seq=12)
    assert c.category == "Host Maintenance", c.explanation


@pytest.mark.parametrize("line", [
    "I 12-05 10:21:07 recovery_strategy.py:101] Cluster train-2ea4 was preempted. Recovering the job...",
    "state: PREEMPTED",
    "       JobId=4242 JobName=pretrain JobState=PREEMPTED Reason=None Dependency=(null)",
    "StateReason: Server.SpotInstanceTermination: Spot instance termination",
    "  Warning  Preempted  12s  default-scheduler  Preempted by research/high-prio-0 on node gpu-node-3",
    "    Reason: PreemptionByScheduler",
    "The Spot instance i-0abc123 was reclaimed by EC2 (capacity).",
])
def test_other_wordings_of_a_preemption_are_host_maintenance(line: str) -> None:
    c = _then_timeout(line, r=3, seq=12)
    assert c.category == "Host Maintenance", (line, c.explanation)


@pytest.mark.parametrize("line", [
    "This pod will not be preempted: priorityClass system-node-critical",
    "Pods of this class cannot be preempted",
    "Memory was reclaimed by the kernel's shrinker",
    "Note: the scheduler preempted nothing",
    "Our launcher restarts from the last checkpoint if the node is preempted",
    "In case the node is preempted, the job resumes from the last checkpoint",
    "Resuming: the previous attempt was preempted",
    "Node 0, zone Normal: 1234 pages were reclaimed",
])
def test_a_preemption_that_did_not_happen_or_memory_reclaimed_is_not_one(line: str) -> None:
    assert classify_text(line, "k").category != "Host Maintenance", line


def test_a_timeout_right_after_a_ranks_own_work_is_the_program() -> None:
    for work in ("Running evaluation on 4 GPUs",
                 "`Trainer.fit` stopped: `max_epochs=10` reached.",
                 "2026-11-30 09:00:01 INFO Saving checkpoint to /ckpt/step_400"):
        c = _then_timeout(work)
        assert c.category == "Software Bug", (work, c.explanation)
    # no work line, or the work long done before the timeout: the cause is not in this log
    assert classify_text(TIMEOUT.format(r=1, seq=3, op="ALLREDUCE"), "k").category == "NCCL Watchdog Timeouts"
    far = "\n".join(["2026-11-30T01:00:00Z Saving checkpoint to /ckpt/step_400",
                     "2026-11-30T09:00:00Z " + TIMEOUT.format(r=1, seq=3, op="ALLREDUCE")])
    assert classify_text(far, "k").category == "NCCL Watchdog Timeouts"
    # a hardware cause still wins over the busy rank
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."
    c = _then_timeout("Saving checkpoint", xid)
    assert c.category == "Faulty GPU"


@pytest.mark.parametrize("work", [
    "[INFO|trainer.py:3158] 2024-05-01 10:00:00,001 >> ***** Running Prediction *****",
    "Running tokenizer on dataset:  45%|████▌     | 4500/10000 [00:03<00:04, 1200.00 examples/s]",
    "Map (num_proc=8):  12%|█▏        | 1200/10000 [00:41<05:01, 29.20 examples/s]",
    "Tokenizing train dataset:  80%|████████  | 8000/10000 [01:10<00:17, 114.29 examples/s]",
    "Predicting DataLoader 0:  33%|███▎      | 10/30 [00:02<00:04,  4.50it/s]",
    " > compiling dataset index builder ...",
    " saving checkpoint at iteration     500 to /ckpt",
    "Running loglikelihood requests:  27%|██▋       | 2700/10000 [12:03<32:36,  3.73it/s]",
])
def test_the_frameworks_own_rank_local_phases_before_a_timeout_are_the_program(work: str) -> None:
    c = _then_timeout(work)
    assert c.category == "Software Bug", (work, c.explanation)


def test_a_busy_rank_and_the_ranks_that_waited_for_it_are_named() -> None:
    lines = ["[rank0]:Running tokenizer on dataset:  60%|██████    | 6000/10000 [29:58<19:58,  3.34 examples/s]",
             TIMEOUT.format(r=1, seq=1, op="BROADCAST"), TIMEOUT.format(r=3, seq=1, op="BROADCAST"),
             TIMEOUT.format(r=2, seq=1, op="BROADCAST")]
    c = classify_text("\n".join(lines), "k")
    assert c.category == "Software Bug", c.explanation
    assert "rank 0: '[rank0]:Running tokenizer on dataset" in c.explanation
    assert "then the first timeouts came from ranks 1, 2, 3" in c.explanation
    # torchrun's "[default0]:" is the local rank: said as such, and never taken for a global one
    local = classify_text("\n".join(["[default0]:Running tokenizer on dataset:  60%|██████ | 6000/10000",
                                     TIMEOUT.format(r=0, seq=1, op="BROADCAST")]), "k")
    assert "local rank 0: " in local.explanation and "from rank 0" in local.explanation, local.explanation


def test_a_phase_thousands_of_lines_before_the_timeout_is_over_and_not_its_cause() -> None:
    steps = [f"2024-05-01 step {i} loss 2.{i % 10}" for i in range(2500)]
    text = "\n".join(["Running tokenizer on dataset:  97%|█████████▋| 9700/10000", *steps,
                      TIMEOUT.format(r=1, seq=9000, op="ALLREDUCE")])
    assert classify_text(text, "k").category == "NCCL Watchdog Timeouts"
    near = "\n".join(["Running tokenizer on dataset:  97%|█████████▋| 9700/10000", *steps[:100],
                      TIMEOUT.format(r=1, seq=9000, op="ALLREDUCE")])
    assert classify_text(near, "k").category == "Software Bug"
    # a phase whose bar reached 100% ended: not the one the others waited for
    done = near.replace(" 97%|█████████▋| 9700/10000", "100%|██████████| 10000/10000")
    assert classify_text(done, "k").category == "NCCL Watchdog Timeouts"


@pytest.mark.parametrize("line", [
    "Mapping: 45%", "Heatmap: 45% done", "Tokenizing is slow on this machine", "Sitemap:  50% crawled",
])
def test_words_like_the_phases_are_not_rank_local_work(line: str) -> None:
    c = _then_timeout(line)
    assert c.category == "NCCL Watchdog Timeouts", (line, c.explanation)


def test_ranks_timing_out_in_different_collectives_are_a_desync() -> None:
    desync = [TIMEOUT.format(r=0, seq=808, op="ALLREDUCE"), TIMEOUT.format(r=1, seq=809, op="ALLREDUCE")]
    assert classify_text("\n".join(desync), "k").category == "Software Bug"
    kinds = [TIMEOUT.format(r=0, seq=21, op="BROADCAST"), TIMEOUT.format(r=1, seq=21, op="ALLREDUCE")]
    assert classify_text("\n".join(kinds), "k").category == "Software Bug"
    # all ranks stuck in the same collective: no desync in the log
    same = [TIMEOUT.format(r=r, seq=808, op="ALLREDUCE") for r in range(4)]
    assert classify_text("\n".join(same), "k").category == "NCCL Watchdog Timeouts"
    # different process groups count their sequence numbers apart
    pgs = ["[PG ID 0 PG GUID 0 Rank 0] " + TIMEOUT.format(r=0, seq=5, op="ALLREDUCE").split("] ", 1)[1],
           "[PG ID 1 PG GUID 1 Rank 1] " + TIMEOUT.format(r=1, seq=90, op="ALLREDUCE").split("] ", 1)[1]]
    assert classify_text("\n".join(pgs), "k").category == "NCCL Watchdog Timeouts"


def test_a_crash_inside_nccl_is_the_release_and_weaker_than_hardware() -> None:
    frames = ["[node-01:288505:0:296459] Caught signal 11 (Segmentation fault: address not mapped to object at "
              "address 0x48)",
              " 3  /opt/nccl/lib/libnccl.so(+0x120057) [0x7ff1c18c1057]",
              " 4  /usr/lib/x86_64-linux-gnu/libnccl.so.2(+0x12209d) [0x7ff1c18c309d]"]
    c = classify_text("\n".join(frames), "k")
    assert c.category == "Dependency" and "NCCL" in c.explanation
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."
    assert classify_text("\n".join([xid, *frames]), "k").category == "Faulty GPU"


@pytest.mark.parametrize(("line", "named"), [
    ("RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a "
     "driver from http://www.nvidia.com/Download/index.aspx", "no usable NVIDIA driver"),
    ("RuntimeError: CUDA error: no CUDA-capable device is detected", "no usable NVIDIA driver"),
    ("nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown", "no usable NVIDIA driver"),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA "
     "driver is installed and running.", "no usable NVIDIA driver"),
    ("NVRM: API mismatch: the client has the version 535.129.03, but this kernel module has the version 535.104.05.  "
     "Please make sure that this kernel module and all NVIDIA driver components have the same version.",
     "driver libraries 535.129.03, kernel module 535.104.05"),
    ("OSError: [Errno 24] Too many open files", "ulimit -n"),
    ("RuntimeError: unable to open shared memory object </torch_1234_567> in read-write mode: Too many open files (24)",
     "ulimit -n"),
    ("node1:1:2 [0] misc/ibvwrap.cc:190 NCCL WARN Call to ibv_reg_mr failed with error Cannot allocate memory",
     "ulimit -l"),
    ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. The "
     "server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use).", "MASTER_PORT"),
    ("[E ProcessGroupGloo.cpp:138] Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/"
     "pair.cc:144] no error", "GLOO_SOCKET_IFNAME"),
])
def test_the_hosts_driver_limits_and_ports_are_the_environment(line: str, named: str) -> None:
    c = classify_text(line, "k")
    assert c.category == "Dependency", (line, c.explanation)
    assert named in c.explanation


def test_nccls_own_out_of_memory_is_the_programs_gpu_memory() -> None:
    line = ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error, "
            "NCCL version 2.20.5\nncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
            "Cuda failure 'out of memory'")
    c = classify_text(line, "k")
    assert (c.category, c.confidence) == ("Software Bug", 0.7), c.explanation


@pytest.mark.parametrize("line", [
    "Failed to allocate memory for the page cache: Cannot allocate memory",
    "INFO: GPU 0 has no CUDA-capable device attached? checking...",
    "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.",
    "E1204 tensorboard: error: could not bind to port 6006: Address already in use",
])
def test_lines_near_the_environment_signatures_are_not_them(line: str) -> None:
    # (and below: another program's port is not the job's)
    assert classify_text(line, "k").category != "Dependency", line


@pytest.mark.parametrize(("line", "gpu"), [
    ("Dec  1 10:00:00 node1 kernel: NVRM: GPU at PCI:0000:3b:00: GPU-1b2c3d4e-0000-1111-2222-333344445555 has fallen "
     "off the bus.", "0000:3b:00"),
    ("Dec  1 10:00:00 node1 kernel: NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.", "0000:3b:00"),
    ("Dec  1 10:00:00 node1 kernel: NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x26:0xffff:1462)", "0000:3b:00"),
])
def test_the_drivers_own_words_for_a_lost_gpu_name_it_without_an_xid(line: str, gpu: str) -> None:
    c = classify_text(line, "k")
    assert (c.category, c.gpu) == ("Faulty GPU", gpu), c.explanation


def test_fallen_off_the_bus_about_something_else_is_not_a_gpu() -> None:
    assert classify_text("the cable has fallen off the bus bar in rack 3", "k").category == "Unknown"


def test_two_ranks_on_one_gpu_is_the_script_naming_both() -> None:
    line = "node1:1:2 [1] init.cc:1234 NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 3b000"
    c = classify_text(line, "k")
    assert (c.category, c.confidence) == ("Software Bug", 0.85), c.explanation
    assert "ranks 1 and 0 on CUDA device 3b000" in c.explanation and "set_device" in c.explanation


@pytest.mark.parametrize("line", [
    "RuntimeError: [enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file data.pkl: file "
    "write failed",
    "RuntimeError: [enforce fail at inline_container.cc:595] . unexpected pos 1920 vs 1808",
])
def test_the_checkpoint_writer_failing_in_the_os_is_the_file_system(line: str) -> None:
    c = classify_text(line, "k")
    assert (c.category, c.confidence) == ("Dependency", 0.7), c.explanation
    # ENOSPC says which: the full disk is the stronger answer
    c = classify_text(line + "\nOSError: [Errno 28] No space left on device", "k")
    assert c.category == "Dependency" and c.confidence >= 0.85, c.explanation
    assert c.explanation.startswith("a file system the job writes to is full"), c.explanation


def test_torchelastic_reporting_a_segfaulted_rank_is_a_crash_on_a_signal() -> None:
    line = ("torch.distributed.elastic.multiprocessing.api:[ERROR] failed (exitcode: -11) local_rank: 0 (pid: 1234) of "
            "binary: /usr/bin/python")
    c = classify_text(line, "k")
    assert (c.category, c.confidence) == ("Software Bug", 0.45), c.explanation


def test_work_after_the_first_timeout_cannot_push_out_the_work_before_it(tmp_path: Path) -> None:
    # the busy rank goes on printing after the others gave up, or the job restarts and saves again
    bars = [f"[rank0]:Running tokenizer on dataset:  {p}%|██ | {p}/100" for p in range(10, 20)]
    more = [f"[rank0]:Running tokenizer on dataset:  {p}%|███ | {p}/100" for p in range(20, 60)]
    timeouts = [TIMEOUT.format(r=r, seq=1, op="BROADCAST") for r in (1, 2, 3)]
    c = classify_text("\n".join([*bars, *timeouts, *more]), "k")
    assert c.category == "Software Bug" and "19%" in c.explanation, c.explanation
    # two files of one source: the second file's own saves do not push out the first file's
    (tmp_path / "a-rank0.log").write_text("Saving model checkpoint to /c/last\n" + TIMEOUT.format(r=1, seq=3,
                                                                                              op="ALLREDUCE") + "\n")
    (tmp_path / "b-rank1.log").write_text("".join(f"Saving model checkpoint to /c/{i}\n" for i in range(40)))
    [d] = classify_paths([tmp_path])
    assert d.category == "Software Bug" and "/c/last" in d.explanation, d.explanation


def test_the_work_nearest_the_timeout_counts_however_many_came_before() -> None:
    # a long run saves a checkpoint many times; only the save right before the timeout is the busy rank's work
    steps = [f"2024-05-01 step {i} loss 2.{i % 10}" for i in range(2100)]
    saves = []
    for n in range(20):
        saves += [f"Saving model checkpoint to /ckpt/checkpoint-{n}", *steps]
    text = "\n".join([*saves, "Saving model checkpoint to /ckpt/checkpoint-final",
                      TIMEOUT.format(r=1, seq=9000, op="ALLREDUCE")])
    c = classify_text(text, "k")
    assert c.category == "Software Bug" and "checkpoint-final" in c.explanation, c.explanation


@pytest.mark.parametrize(("bar", "busy"), [
    ("Processing files:  45%|████▌     | 4500/10000 [29:03<32:00,  2.3it/s]", True),
    ("[rank0]:Indexing corpus:  60%|██████    | 6/10 [31:00<20:40, 310.0s/it]", True),
    ("Epoch 0:  45%|████▌     | 450/1000 [03:00<03:40, 2.5it/s, loss=0.3]", False),
    ("Training:  45%|████▌     | 450/1000 [03:00<03:40, 2.5it/s]", False),
    (" 45%|████▌     | 450/1000 [03:00<03:40, 2.5it/s]", False),
    ("Loading checkpoint shards: 100%|██████████| 38/38 [00:33<00:00,  1.15it/s]", False),
    # tqdm redirected to a file: its updates joined by carriage returns; where the bar stands is the last one
    ("Loading checkpoint shards:   0%|          | 0/38\rLoading checkpoint shards: 100%|██████████| 38/38", False),
    ("Indexing corpus:   0%|          | 0/38\rIndexing corpus:  45%|████▌     | 17/38", True),
    ("Progress:  45%|████▌     | 450/1000", False),
    ("Rollout:  45%|████▌     | 450/1000", False),
    ("GPU util:  45%|████▌     | 450/1000", False),
])
def test_a_labelled_progress_bar_of_other_work_before_a_timeout_is_a_busy_rank(bar: str, busy: bool) -> None:
    c = _then_timeout(bar)
    assert (c.category == "Software Bug") is busy, (bar, c.explanation)
