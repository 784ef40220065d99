import cProfile, pstats, torch
from flashcourse import kernels
x = torch.randn(1, 16, 128, 64, device="cuda", dtype=torch.float16)
q = torch.randn(1, 32, 128, device="cuda", dtype=torch.float16); cache = torch.randn(1, 8, 128, 128, device="cuda", dtype=torch.float16)
with torch.no_grad():
    for _ in range(50): kernels.flash_attention(x, x, x); kernels.flash_decode(q, cache, cache)
    torch.cuda.synchronize()
    pr = cProfile.Profile(); pr.enable()
    for _ in range(2000): kernels.flash_attention(x, x, x)
    torch.cuda.synchronize(); pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(18)
    pr = cProfile.Profile(); pr.enable()
    for _ in range(2000): kernels.flash_decode(q, cache, cache)
    torch.cuda.synchronize(); pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(12)
