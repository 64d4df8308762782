package train

import (
	"fmt"

	"github.com/gotron/gotron/ckpt"
	"github.com/gotron/gotron/comm"
)

// verifyIntegrity is Megatron's --verify-integrity on load
// (verify_integrity_manifest): world rank 0 checks every file of the
// checkpoint against what its save recorded and the ranks agree on the
// outcome. gotron's saves always record each file's size and each shard's
// CRC-32C in checkpoint.json (Megatron's save writes integrity.json with
// SHA-256s only under the flag); Open has checked the sizes, and here
// every shard of every tensor, those this run would not read included
// (--no-load-optim, another layout's), is read and its checksum compared.
func (ck *checkpointer) verifyIntegrity(root string, r *ckpt.Reader) error {
	var err error
	shards := 0
	if ck.worldRank() == 0 {
	groups:
		for _, g := range r.Groups() {
			for name, t := range r.Tensors(g) {
				if _, _, err = r.ReadWhole(g, name); err != nil {
					break groups
				}
				shards += max(len(t.Shards), 1)
			}
		}
	}
	failed := []float32{0}
	if err != nil {
		failed[0] = 1
	}
	if ck.par.World.Size() > 1 {
		if cerr := ck.par.World.AllReduce(ck.stepper.cctx, comm.Float32s(failed), comm.Sum); cerr != nil {
			return fmt.Errorf("train: --load %s: --verify-integrity: %w", root, cerr)
		}
	}
	switch {
	case err != nil:
		return fmt.Errorf("train: --load %s: --verify-integrity: checkpoint integrity verification failed: %w", root, err)
	case failed[0] > 0:
		return fmt.Errorf("train: --load %s: --verify-integrity: checkpoint integrity verification failed on world rank 0: see its log", root)
	}
	if ck.worldRank() == 0 {
		ck.printf("Checkpoint integrity verified: %d shard(s) OK in %s", shards, root)
	}
	return nil
}
