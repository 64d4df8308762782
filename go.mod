module github.com/gotron/gotron

go 1.26.0

require (
	github.com/dlclark/regexp2/v2 v2.5.1
	github.com/ebitengine/purego v0.11.3
	github.com/nikolalohinski/gonja/v2 v2.9.1
	github.com/spf13/pflag v1.1.0
	github.com/tiktoken-go/tokenizer v0.10.0
	go.yaml.in/yaml/v3 v3.0.6
	golang.org/x/sys v0.49.0
	google.golang.org/protobuf v1.34.2
)

require (
	github.com/dustin/go-humanize v1.0.1 // indirect
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.2 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/sirupsen/logrus v1.9.3 // indirect
	golang.org/x/exp v0.0.0-20240719175910-8a7402abbf56 // indirect
	golang.org/x/text v0.23.0 // indirect
)
