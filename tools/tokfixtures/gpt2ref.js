// Prints the GPT-2 ids of a file with the reference JS gpt-3-encoder.
// Usage: node gpt2ref.js <gpt-3-encoder package dir> <text file>
const {encode} = require(process.argv[2] + '/Encoder.js');
const fs = require('fs');
const text = fs.readFileSync(process.argv[3], 'utf-8');
process.stdout.write(encode(text).join(' ') + '\n');
