module github.com/gotron/gotron

go 1.26.0

require (
	github.com/dlclark/regexp2/v2 v2.5.1
	github.com/tiktoken-go/tokenizer v0.10.0
	go.yaml.in/yaml/v3 v3.0.6
	golang.org/x/sys v0.49.0
	google.golang.org/protobuf v1.34.2
)
