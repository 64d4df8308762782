package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestDeviceSimGenerateAndServe: generate and serve with --device sim (the
// simulated device) print and answer exactly what they do on the CPU, and
// report the host copies they made; serve's step reads back only the drawn
// tokens. A bad --device value is refused naming the flag.
func TestDeviceSimGenerateAndServe(t *testing.T) {
	ck := serveCheckpoint(t)
	prompt := "Once upon a time"
	want := generateText(t, ck, prompt, 12)
	out, errs, code := runCLI(t, "generate", "--load", ck, "--prompt", prompt, "--top-k", "1", "--max-new-tokens", "12", "--device", "sim")
	if code != 0 || strings.TrimSuffix(strings.TrimPrefix(out, prompt), "\n") != want {
		t.Fatalf("generate --device sim: %d %q %s; on the cpu %q", code, out, errs, want)
	}
	if !strings.Contains(errs, "sim device:") || !strings.Contains(errs, "host-to-device copies") {
		t.Errorf("generate --device sim did not report its copies: %s", errs)
	}

	base, stop := startServe(t, "--load", ck, "--device", "sim")
	code, body := postJSON(t, base+"/v1/completions", `{"prompt":"`+prompt+`","max_tokens":12,"temperature":0}`)
	stop()
	var c struct{ Choices []struct{ Text string } }
	if code != 200 || json.Unmarshal(body, &c) != nil || len(c.Choices) != 1 || c.Choices[0].Text != want {
		t.Fatalf("serve --device sim: %d %s; generate printed %q", code, body, want)
	}

	if _, errs, code := runCLI(t, "generate", "--load", ck, "--prompt", prompt, "--device", "gpu"); code == 0 || !strings.Contains(errs, "--device") {
		t.Errorf("--device gpu: exit %d, %s", code, errs)
	}
}
