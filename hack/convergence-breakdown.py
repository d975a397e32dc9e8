#!/usr/bin/env python3
"""Where a block's way to every node's kernel goes, from a route
convergence run with its logs kept:

  TABBY_BENCH_LOGS=/tmp/rc TABBY_BENCH_LOG_LEVEL=debug \\
    go test -run '^$' -bench 'RouteConvergence/nodes=30' -benchtime 1x ./test/bench/
  hack/convergence-breakdown.py /tmp/rc rc30-0 rr     # or mesh

Per block (the run's second half of blocks is the reflector phase): adv is
its claim until the owner sent it; rr_in until a reflector received it;
rr_out from then until the reflector sent it on; client_rx the claim until
a client received it; kernel from then until its route was in that
client's kernel; total the claim until every node had it; rx_copies how
many times a client received the prefix in the run. Node i is 10.79.0.(10+i).
"""
import glob, os, re, statistics, sys
from datetime import datetime

d, prefix, phase = sys.argv[1], sys.argv[2], sys.argv[3]
ts = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
logs = glob.glob(os.path.join(d, prefix + "-node*.log"))
ip = {os.path.basename(f)[:-4]: "10.79.0.%d" % (10 + int(os.path.basename(f)[len(prefix) + 5:-4])) for f in logs}
blocks = []
for line in open(os.path.join(d, prefix + "-routes.txt")):
    f = line.split()
    kv = dict(x.split("=", 1) for x in f[1:])
    blocks.append((ts(kv.pop("created")), f[0], kv.pop("owner"), {k: ts(v) for k, v in kv.items()}))
blocks.sort()
blocks = blocks[len(blocks) // 2:] if phase == "rr" else blocks[:len(blocks) // 2]
wanted = {b[1] for b in blocks}
ev = {}
rx = re.compile(r'time=(\S+) level=DEBUG msg="(received|sent) update".*? key=(\S+).*?nlri=\[([^\]]*)\]')
for fn in logs:
    e = ev.setdefault(os.path.basename(fn)[:-4], {})
    for line in open(fn, errors="replace"):
        m = rx.search(line)
        if m:
            for p in m.group(4).split():
                if p in wanted:
                    e.setdefault(p, []).append((ts(m.group(1)), m.group(2), m.group(3)))
rows = {k: [] for k in ["adv", "rr_in", "rr_out", "client_rx", "kernel", "total", "rx_copies"]}
rr = {prefix + "-node1", prefix + "-node2"} if phase == "rr" else set()
for t0, p, owner, routes in blocks:
    sent = [t for t, k, _ in ev.get(owner, {}).get(p, []) if k == "sent"]
    others = [n for n in ip if n != owner]
    if not sent or any(n not in routes for n in others):
        continue
    rows["adv"].append(min(sent) - t0)
    rows["total"].append(max(routes[n] for n in others) - t0)
    for r in rr - {owner}:
        e = ev.get(r, {}).get(p, [])
        rin = [t for t, k, peer in e if k == "received" and peer == ip[owner]]
        if rin:
            rows["rr_in"].append(min(rin) - min(sent))
            for c in others:
                out = [t for t, k, peer in e if k == "sent" and peer == ip[c]]
                if out:
                    rows["rr_out"].append(min(out) - min(rin))
    for n in others:
        if n in rr:
            continue
        got = [t for t, k, _ in ev.get(n, {}).get(p, []) if k == "received"]
        if got:
            rows["client_rx"].append(min(got) - t0)
            rows["kernel"].append(routes[n] - min(got))
            rows["rx_copies"].append(len(got))
for k, v in rows.items():
    if v:
        v.sort()
        f = (lambda x: "%.0f ms" % (x * 1000)) if k != "rx_copies" else (lambda x: "%.1f" % x)
        print("%-10s n=%4d p50 %8s  p90 %8s  max %8s" % (k, len(v), f(v[len(v) // 2]), f(v[int(len(v) * .9)]), f(v[-1])))
