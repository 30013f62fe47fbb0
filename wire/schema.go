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
