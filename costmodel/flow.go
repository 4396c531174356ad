package costmodel

import "fmt"

// String returns "home" or "chain".
func (f Flow) String() string {
	switch f {
	case FlowHome:
		return "home"
	case FlowChain:
		return "chain"
	}
	return fmt.Sprintf("Flow(%d)", int(f))
}

// ParseFlow parses "home" or "chain"; anything else is an error.
func ParseFlow(s string) (Flow, error) {
	switch s {
	case "home":
		return FlowHome, nil
	case "chain":
		return FlowChain, nil
	}
	return 0, fmt.Errorf("costmodel: unknown flow %q (want home or chain)", s)
}

// String returns "sequential" or "overlapped".
func (m Mode) String() string {
	switch m {
	case Sequential:
		return "sequential"
	case Overlapped:
		return "overlapped"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ParseMode parses "sequential" or "overlapped"; anything else is an error.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "sequential":
		return Sequential, nil
	case "overlapped":
		return Overlapped, nil
	}
	return 0, fmt.Errorf("costmodel: unknown mode %q (want sequential or overlapped)", s)
}
