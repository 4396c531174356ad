package stackdispatch

import "fmt"

// Routing is one MoE layer's routed tokens, in the order the trace holds
// them: token t starts on EP rank Source[t] and picked the logical experts
// Experts[t*TopK : (t+1)*TopK].
type Routing struct {
	TopK    int
	Experts []int32
	Source  []int32
}

// Picker returns the physical id (slot) a token's k-th pick goes to. src is
// the token's EP rank, token its index among src's tokens in trace order
// (0, 1, 2, ... per rank), expert the logical expert it picked.
type Picker func(src int32, token int64, k int, expert int32) int32

// CountTokens recounts, token by token, how many routed (token, expert) pairs
// each of gpus GPUs receives when pick decides every pair; slot p is on GPU p
// / slotsPerGPU. It fails, naming the token, on a source rank outside [0,
// gpus), on lengths that do not match TopK, or on a pick outside the GPUs'
// slots (a negative pick included).
func CountTokens(rt Routing, slotsPerGPU, gpus int, pick Picker) ([]int64, error) {
	if rt.TopK <= 0 || slotsPerGPU <= 0 || gpus <= 0 {
		return nil, fmt.Errorf("stackdispatch: top-k %d, slots per GPU %d and GPUs %d must be positive", rt.TopK, slotsPerGPU, gpus)
	}
	if len(rt.Experts) != len(rt.Source)*rt.TopK {
		return nil, fmt.Errorf("stackdispatch: %d expert ids for %d tokens of top-k %d", len(rt.Experts), len(rt.Source), rt.TopK)
	}
	load := make([]int64, gpus)
	next := make([]int64, gpus) // each rank's next token index
	for t, src := range rt.Source {
		if src < 0 || int(src) >= gpus {
			return nil, fmt.Errorf("stackdispatch: token %d: source rank %d outside [0,%d)", t, src, gpus)
		}
		idx := next[src]
		next[src]++
		for k := 0; k < rt.TopK; k++ {
			e := rt.Experts[t*rt.TopK+k]
			p := pick(src, idx, k, e)
			if p < 0 || int(p) >= slotsPerGPU*gpus {
				return nil, fmt.Errorf("stackdispatch: token %d pick %d (expert %d): slot %d outside [0,%d)", t, k, e, p, slotsPerGPU*gpus)
			}
			load[int(p)/slotsPerGPU]++
		}
	}
	return load, nil
}

// StaticPicker picks as SGLang's static dispatch does: table[src][layer]
// [expert] (a table from SGLangStaticTable). An expert outside the table
// picks -1, which CountTokens reports.
func StaticPicker(table [][][]int32, layer int) Picker {
	return func(src int32, _ int64, _ int, expert int32) int32 {
		if int(src) >= len(table) || layer < 0 || layer >= len(table[src]) || expert < 0 || int(expert) >= len(table[src][layer]) {
			return -1
		}
		return table[src][layer][expert]
	}
}

// VLLMPicker picks as vLLM's newest hash does: replicas[expert]
// [VLLMReplica(row, len(replicas[expert]))], replicas[e] being the expert's
// row of logical_to_physical_map. row is the token's index in its rank's
// forward pass: its index among the rank's tokens modulo batchTokens (the
// tokens each rank runs per forward pass), or that index itself when
// batchTokens <= 0 (the whole trace as one pass). An expert with no copy
// picks -1.
func VLLMPicker(replicas [][]int32, batchTokens int) Picker {
	return func(_ int32, token int64, _ int, expert int32) int32 {
		if expert < 0 || int(expert) >= len(replicas) || len(replicas[expert]) == 0 {
			return -1
		}
		row := token
		if batchTokens > 0 {
			row %= int64(batchTokens)
		}
		return replicas[expert][VLLMReplica(row, len(replicas[expert]))]
	}
}

// CountTRTLLM recounts what TensorRT-LLM's routing kernel sends to each GPU:
// each rank's tokens, in trace order, cut into forward passes of batchTokens
// tokens (batchTokens <= 0: one pass), each pass routed by TRTLLMRoute with
// rankOffset = the rank when attentionDP is set. Its errors are CountTokens'
// and TRTLLMRoute's.
func CountTRTLLM(rt Routing, replicas [][]int32, slotsPerGPU, gpus, batchTokens int, attentionDP bool) ([]int64, error) {
	if rt.TopK <= 0 || len(rt.Experts) != len(rt.Source)*rt.TopK {
		return nil, fmt.Errorf("stackdispatch: %d expert ids for %d tokens of top-k %d", len(rt.Experts), len(rt.Source), rt.TopK)
	}
	perRank := make([][]int32, gpus)
	for t, src := range rt.Source {
		if src < 0 || int(src) >= gpus {
			return nil, fmt.Errorf("stackdispatch: token %d: source rank %d outside [0,%d)", t, src, gpus)
		}
		perRank[src] = append(perRank[src], rt.Experts[t*rt.TopK:(t+1)*rt.TopK]...)
	}
	routed := make([][]int32, gpus)
	for r, flat := range perRank {
		pass := len(flat)
		if batchTokens > 0 {
			pass = batchTokens * rt.TopK
		}
		offset := 0
		if attentionDP {
			offset = r
		}
		for start := 0; start < len(flat); start += max(pass, 1) {
			var err error
			routed[r], err = TRTLLMRoute(flat[start:min(start+pass, len(flat))], replicas, offset, -1, routed[r])
			if err != nil {
				return nil, err
			}
		}
	}
	next := make([]int, gpus)
	return CountTokens(rt, slotsPerGPU, gpus, func(src int32, _ int64, _ int, _ int32) int32 {
		p := routed[src][next[src]]
		next[src]++
		return p
	})
}
