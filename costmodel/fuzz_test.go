package costmodel

import (
	"bytes"
	"testing"
)

// FuzzReadClusterModel: the YAML readers never panic, and what they accept
// validates and writes back to YAML that reads back the same.
func FuzzReadClusterModel(f *testing.F) {
	for _, name := range ClusterNames() {
		c, _ := ClusterPreset(name)
		var b bytes.Buffer
		if err := WriteClusterYAML(&b, c); err == nil {
			f.Add(b.Bytes())
		}
	}
	for _, name := range ModelNames() {
		m, _ := ModelPreset(name)
		var b bytes.Buffer
		if err := WriteModelYAML(&b, m); err == nil {
			f.Add(b.Bytes())
		}
	}
	f.Add([]byte("base: h100x8\nnodes: 2\n"))
	f.Add([]byte("base: mixtral-8x7b\ntop_k: 3\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<14 {
			return
		}
		if c, err := ReadCluster(bytes.NewReader(data)); err == nil {
			if err := c.Validate(); err != nil {
				t.Fatalf("ReadCluster accepted an invalid cluster: %v", err)
			}
			var b bytes.Buffer
			if err := WriteClusterYAML(&b, c); err != nil {
				t.Fatalf("write: %v", err)
			}
			if _, err := ReadCluster(&b); err != nil {
				t.Fatalf("round trip: %v\n%s", err, b.String())
			}
		}
		if m, err := ReadModel(bytes.NewReader(data)); err == nil {
			if err := m.Validate(); err != nil {
				t.Fatalf("ReadModel accepted an invalid model: %v", err)
			}
		}
	})
}
