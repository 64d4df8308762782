# Regenerates shuffle_golden.txt with numpy (run with /usr/bin/python3; CI never runs it).
# Each line: seed n first8 last3 dot(a, arange(n)) second-shuffle-of-arange(7)-on-same-generator
import numpy as np
out = []
for seed in [0, 1234, 2**32 - 1]:
    for n in [1, 2, 10, 1000, 70000]:
        r = np.random.RandomState(seed); a = np.arange(n); r.shuffle(a)
        b = np.arange(7); r.shuffle(b)
        out.append(f"{seed} {n} {a[:8].tolist()} {a[-3:].tolist()} {int(a.astype(np.int64).dot(np.arange(n, dtype=np.int64)))} {b.tolist()}")
open('shuffle_golden.txt', 'w').write("\n".join(out) + "\n")
