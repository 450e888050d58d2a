// kstatus prints what sigs.k8s.io/cli-utils' kstatus (the library behind Flux's
// healthChecks and `kubectl wait`-style readiness in many tools) computes for objects.
//
// Input on stdin: a JSON array of Kubernetes objects. Output on stdout: a JSON array of
// {"status": <Current|InProgress|Failed|Terminating|NotFound|Unknown>, "message": ...}, one
// per input object, in order.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type verdict struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	var raw []json.RawMessage
	if err := json.NewDecoder(os.Stdin).Decode(&raw); err != nil {
		fmt.Fprintln(os.Stderr, "kstatus: stdin must be a JSON array of objects:", err)
		os.Exit(2)
	}
	out := make([]verdict, 0, len(raw))
	for i, item := range raw {
		// UnmarshalJSON keeps integers as int64, which kstatus' generation checks need.
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(item); err != nil {
			fmt.Fprintf(os.Stderr, "kstatus: object %d: %v\n", i, err)
			os.Exit(2)
		}
		result, err := status.Compute(obj)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kstatus: object %d: %v\n", i, err)
			os.Exit(1)
		}
		out = append(out, verdict{Status: result.Status.String(), Message: result.Message})
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(1)
	}
}
