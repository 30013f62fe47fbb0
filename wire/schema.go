package wire

// Schema returns the canonical wire shape of both message enums at protocol
// ver, in the text format of the reference's schema/v{N}.txt files.
func Schema(ver uint16) string {
	b := append([]byte(nil), "client\n"...)
	b = schemaLinesClientMessage(b, ver)
	b = append(b, "server\n"...)
	b = schemaLinesServerMessage(b, ver)
	return string(b)
}

// comma separates list items in a shape: it appends ',' unless b ends
// with the list's opening bracket.
func comma(b []byte) []byte {
	if n := len(b); n > 0 && (b[n-1] == '{' || b[n-1] == '[') {
		return b
	}
	return append(b, ',')
}
