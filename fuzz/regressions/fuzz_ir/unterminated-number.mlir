module {
}
%0 = arith.constant 12