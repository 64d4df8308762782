package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
)

// Message is one chat message.
type Message struct {
	Role    string
	Content string
}

// ChatTemplate renders chat messages to a prompt with a Hugging Face
// chat_template (Jinja, rendered by gonja as transformers renders it:
// trim_blocks and lstrip_blocks on; messages, add_generation_prompt,
// bos_token, eos_token, raise_exception and strftime_now defined). A nil
// *ChatTemplate renders PlainTemplate. Safe for concurrent use.
type ChatTemplate struct {
	mu       sync.Mutex // protects tpl (serialises renders)
	tpl      *exec.Template
	bos, eos string
}

// errTemplate wraps errors raised while rendering (raise_exception, bad
// messages for the template): the request's fault.
var errTemplate = errors.New("chat template")

// ParseChatTemplate compiles src with the special-token strings bos and eos.
func ParseChatTemplate(src, bos, eos string) (*ChatTemplate, error) {
	cfg := config.New()
	cfg.TrimBlocks, cfg.LeftStripBlocks = true, true
	env := &exec.Environment{
		Context:           exec.EmptyContext().Update(builtins.GlobalFunctions).Update(builtins.GlobalVariables),
		Filters:           builtins.Filters,
		Tests:             builtins.Tests,
		ControlStructures: builtins.ControlStructures,
		Methods:           builtins.Methods,
	}
	env.Context.Set("raise_exception", func(msg string) (string, error) { return "", fmt.Errorf("%w: %s", errTemplate, msg) })
	env.Context.Set("strftime_now", func(format string) string { return strftime(time.Now(), format) })
	loader, err := loaders.NewMemoryLoader(map[string]string{"/chat_template": src})
	if err != nil {
		return nil, err
	}
	tpl, err := exec.NewTemplate("/chat_template", cfg, loader, env)
	if err != nil {
		return nil, fmt.Errorf("server: chat template: %w", err)
	}
	return &ChatTemplate{tpl: tpl, bos: bos, eos: eos}, nil
}

// LoadChatTemplate reads the chat template of a Hugging Face tokenizer
// directory: chat_template.jinja, else tokenizer_config.json's
// chat_template (a string, or a list of named templates: "default" or the
// first). It returns nil, nil when dir has none.
func LoadChatTemplate(dir string) (*ChatTemplate, error) {
	var tc struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
		BOS          json.RawMessage `json:"bos_token"`
		EOS          json.RawMessage `json:"eos_token"`
	}
	path := filepath.Join(dir, "tokenizer_config.json")
	if b, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(b, &tc); err != nil {
			return nil, fmt.Errorf("server: %s: %w", path, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("server: %w", err)
	}
	src := ""
	if b, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja")); err == nil {
		src = string(b)
	} else if len(tc.ChatTemplate) > 0 && string(tc.ChatTemplate) != "null" {
		if err := json.Unmarshal(tc.ChatTemplate, &src); err != nil {
			var named []struct{ Name, Template string }
			if err := json.Unmarshal(tc.ChatTemplate, &named); err != nil || len(named) == 0 {
				return nil, fmt.Errorf("server: %s: chat_template: want a string or a list of {name, template}", path)
			}
			src = named[0].Template
			for _, n := range named {
				if n.Name == "default" {
					src = n.Template
				}
			}
		}
	}
	if src == "" {
		return nil, nil
	}
	t, err := ParseChatTemplate(src, specialToken(tc.BOS), specialToken(tc.EOS))
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, dir)
	}
	return t, nil
}

// specialToken reads a tokenizer_config.json token: "text" or {"content": "text"}.
func specialToken(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var obj struct{ Content string }
	json.Unmarshal(raw, &obj)
	return obj.Content
}

// SpecialTokens returns the bos_token and eos_token strings the template
// renders with.
func (t *ChatTemplate) SpecialTokens() (bos, eos string) { return t.bos, t.eos }

// Render returns the prompt for msgs, ending with the assistant's turn
// opening when addGenerationPrompt is set.
func (t *ChatTemplate) Render(msgs []Message, addGenerationPrompt bool) (string, error) {
	if t == nil {
		return PlainTemplate(msgs, addGenerationPrompt), nil
	}
	list := make([]map[string]any, len(msgs))
	for i, m := range msgs {
		list[i] = map[string]any{"role": m.Role, "content": m.Content}
	}
	ctx := exec.NewContext(map[string]any{
		"messages": list, "add_generation_prompt": addGenerationPrompt,
		"bos_token": t.bos, "eos_token": t.eos,
	})
	t.mu.Lock()
	out, err := t.tpl.ExecuteToString(ctx)
	t.mu.Unlock()
	if err != nil {
		if i := strings.Index(err.Error(), errTemplate.Error()+": "); i >= 0 {
			return "", fmt.Errorf("%w: %s", errTemplate, err.Error()[i+len(errTemplate.Error())+2:])
		}
		return "", fmt.Errorf("%w: %v", errTemplate, err)
	}
	return out, nil
}

// PlainTemplate is the chat format of models without a chat template: one
// line per message, "Role: content" with the role capitalised (System,
// User, Assistant), each ending in "\n", then "Assistant:" when
// addGenerationPrompt is set.
func PlainTemplate(msgs []Message, addGenerationPrompt bool) string {
	var b strings.Builder
	for _, m := range msgs {
		role := m.Role
		if role != "" {
			role = strings.ToUpper(role[:1]) + role[1:]
		}
		b.WriteString(role + ": " + m.Content + "\n")
	}
	if addGenerationPrompt {
		b.WriteString("Assistant:")
	}
	return b.String()
}

// strftime formats t with the C directives chat templates use (%d %b %Y
// and friends); others are kept as written.
func strftime(t time.Time, format string) string {
	r := strings.NewReplacer("%Y", "2006", "%m", "01", "%d", "02", "%B", "January", "%b", "Jan",
		"%A", "Monday", "%a", "Mon", "%H", "15", "%M", "04", "%S", "05", "%y", "06", "%%", "%")
	return t.Format(r.Replace(format))
}
