"""TrainJobs in this process against the sandbox's API in memory (tests/fakeapi.py): the job's objects (JobSet,
TrainJob, runtime) decide the roles, and a replicated job that others depend on never waits for them. The runtime
has the shape of Trainer v2.3.0's shipped DeepSpeed runtime (tests/jobs.py); tests/integration/test_trainjob.py
keeps the shipped runtime applied with kubectl."""

from __future__ import annotations

from tests.jobs import create_trainjob, members, name_of
from tests.runtime.test_sidecar import init


async def test_node_pods_do_not_wait_for_the_launcher_that_depends_on_them(memory, api, logs, inits, sidecars,
                                                                            tmp_path):
    node_pods, launcher = create_trainjob(memory, num_nodes=3)
    outs = {name_of(p): tmp_path / name_of(p) for p in node_pods + launcher}
    started = [inits.start(name_of(p), outs[name_of(p)], "--address", "ip", "--timeout", "30") for p in node_pods]
    for who in started:
        ran = await inits.finish_async(who, timeout=60)
        assert ran.code == 0, ran.err
        assert "not waiting for launcher, created once node is Ready" in ran.err
    first = outs[name_of(node_pods[0])]
    assert members(first) == [(name_of(p), "node", True) for p in node_pods]
    sidecar = await sidecars.start(name_of(node_pods[0]), first, "--address", "ip", "--debounce", "0")
    await sidecar.until(lambda: sidecar.sidecar.ready, what="the sidecar follows from init's generation 1")
    for pod in launcher:  # JobSet creates the launcher now: the node pods are Ready
        memory.create_pod(pod)
    await init(api, logs, name_of(launcher[0]), outs[name_of(launcher[0])], "--address", "ip", "--timeout", "30")
    everyone = [(name_of(p), "node", True) for p in node_pods] + [(name_of(launcher[0]), "launcher", True)]
    assert members(outs[name_of(launcher[0])]) == everyone
    hostfile = (outs[name_of(launcher[0])] / "hostfile").read_text().splitlines()
    assert len(hostfile) == 3 and hostfile[-1].startswith(launcher[0]["status"]["podIP"])
    # the node's sidecar follows the launcher's arrival
    await sidecar.until(lambda: sidecar.sidecar.generation > 1, what="a generation above 1")
    assert members(first) == everyone
    await sidecars.stop(sidecar.who)  # it stops cleanly (its process exited 0)


def test_a_launcher_that_is_not_a_node_is_left_out_of_the_world(memory, api, logs, tmp_path):
    from tests.fakeapi import init_pod

    node_pods, launcher = create_trainjob(memory, num_nodes=2, as_node=False)
    for pod in launcher:
        memory.create_pod(pod)
    out = tmp_path / "launcher"
    ran = init_pod(api, logs, name_of(launcher[0]), out, "--address", "ip", "--timeout", "30")
    assert ran.code == 0, ran.err
    assert "runLauncherAsNode false: training roles node" in ran.err
    assert [m for m in members(out) if m[2]] == [(name_of(p), "node", True) for p in node_pods]
    assert len((out / "hostfile").read_text().splitlines()) == 2
    assert "export WORLD_SIZE=" not in (out / "torch.env").read_text()
