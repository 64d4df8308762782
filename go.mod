module github.com/gotron/gotron

go 1.26.0

require (
	github.com/dlclark/regexp2/v2 v2.5.1 // indirect
	github.com/eliben/go-sentencepiece v0.7.0 // indirect
	github.com/tiktoken-go/tokenizer v0.10.0 // indirect
	go.yaml.in/yaml/v3 v3.0.6 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	google.golang.org/protobuf v1.34.2 // indirect
)
