package wire

import (
	"fmt"
	"reflect"
)

// EnumInfo describes one enum of the protocol for tooling (the JSON form of
// `gradient wire`, tests). The codec itself never uses it.
type EnumInfo struct {
	Name     string // the wire name, as in UnknownVariant errors
	Unit     bool   // every variant is a bare tag; the Go type is an integer
	Variants []VariantInfo
}

// VariantInfo is one variant of an enum.
type VariantInfo struct {
	Tag   uint64
	Name  string
	Since uint16 // 0: in every version
	Until uint16 // 0: never removed; else present only below Until
	Tuple bool   // wraps one value rather than naming fields
	Type  reflect.Type
	Value uint64 // unit enums: the Go constant's value
}

// PresentAt reports whether the variant exists at protocol ver.
func (v VariantInfo) PresentAt(ver uint16) bool {
	return ver >= v.Since && (v.Until == 0 || ver < v.Until)
}

// Enum returns the description of the enum with Go type t.
func Enum(t reflect.Type) (*EnumInfo, bool) {
	e, ok := enums[t]
	return e, ok
}

func invalidVariant(v any) string {
	if v == nil {
		return "no value"
	}
	return fmt.Sprintf("%T is not a variant (or is a nil pointer)", v)
}

func invalidUnit(v uint8) string { return fmt.Sprintf("%d is not a variant", v) }
