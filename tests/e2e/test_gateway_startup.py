"""A gateway started before its workers: once they listen, the first request is served (its
health checks failed at first, so its channels were in reconnect backoff when the workers came
up). Real processes on loopback."""

from __future__ import annotations

import time

from pdserve.client import Client
from pdserve.launch import Stack, free_port
from pdtest.stack import assert_no_leaks

WORKER = ["--max-model-len", "512", "--num-blocks", "200"]


def test_first_request_after_workers_come_up_late(default_model_dir) -> None:
    st = Stack(model=str(default_model_dir))
    try:
        pp, dp = free_port(), free_port()
        gw = st.spawn("gateway", "gateway", [f"--prefill=127.0.0.1:{pp}", f"--decode=127.0.0.1:{dp}",
                                             "--max-model-len", "512"])
        st.wait([gw], 120)
        time.sleep(2.0)  # several failed health checks: the channels back off
        workers = [st.spawn("prefill", "prefill_service", WORKER, port=pp),
                   st.spawn("decode", "decode_service", WORKER, port=dp)]
        st.wait(workers, 300)
        with Client(st.gateway) as c:  # no pause: the gateway must reconnect on demand
            _, ids, done = c.generate(text="The capital of France is", max_tokens=4, temperature=0.0,
                                      ignore_eos=True)
        assert len(ids) == 4, (ids, done)
        assert_no_leaks(st)
    finally:
        st.stop()
