def _add_tokenizer_args(parser):
    parser.add_argument("--tokenizer-type", type=str)
    return parser
