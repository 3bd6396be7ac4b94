// Command kstatus prints the status that kstatus (sigs.k8s.io/cli-utils/pkg/kstatus/status)
// computes for one Kubernetes object, read from standard input as JSON or YAML, as one JSON
// line: {"status": "...", "message": "..."}. It is what Flux's health checks and
// `kstatus`-based waits decide; the integration tests hold pdfleet's status to it.
//
// It reads the object rather than the cluster so that it needs no kube client: the caller
// fetches the object and pipes it in.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"
)

type result struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

func compute(input []byte) (result, error) {
	// YAML is a superset of JSON: one conversion serves both.
	data, err := yaml.YAMLToJSON(input)
	if err != nil {
		return result{}, fmt.Errorf("reading the object: %w", err)
	}
	// apimachinery's decoder turns whole numbers into int64, the type kstatus reads
	// metadata.generation and status.observedGeneration as; encoding/json would give float64
	// and kstatus would then fail to read them.
	var object map[string]interface{}
	if err := utiljson.Unmarshal(data, &object); err != nil {
		return result{}, fmt.Errorf("reading the object: %w", err)
	}
	if object == nil {
		return result{}, fmt.Errorf("reading the object: not a JSON or YAML object")
	}
	res, err := status.Compute(&unstructured.Unstructured{Object: object})
	if err != nil {
		return result{}, fmt.Errorf("computing the status: %w", err)
	}
	return result{Status: res.Status.String(), Message: res.Message}, nil
}

func main() {
	input, err := io.ReadAll(os.Stdin)
	if err == nil {
		var res result
		if res, err = compute(input); err == nil {
			err = json.NewEncoder(os.Stdout).Encode(res)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(1)
	}
}
