"""Coefficients of the Rodas family of stiffly accurate Rosenbrock methods, in the transformed form
of Hairer & Wanner (Solving ODEs II, §IV.7 (7.25) and §VI.4) that `sciad._rosenbrock` steps.

With stages u_i = Σ_j γ_ij k_j of the method (α, Γ, b), the coefficients here are
a = α Γ⁻¹, C = diag(1/γ) − Γ⁻¹, m = b Γ⁻¹, c_i = Σ_j α_ij and d_i = Σ_j γ_ij. Every Rodas method is
stiffly accurate: its last stages' arguments each append the previous stage to the previous stage's
argument, the solution is the last stage argument plus u_s, the embedded solution the last stage
argument itself, so the error estimate is u_s. The coefficients are the published ones (sources at
each tableau); tests/test_rosenbrock.py checks their order conditions.
"""

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class RosenbrockTableau:
    """A Rosenbrock method of s stages in transformed form (shapes below; all float64 NumPy).

    - `gamma`: the diagonal γ of Γ (one LU of M/(hγ) − J per step).
    - `a` (s, s), strictly lower: stage i's argument is y0 + Σ_j a_ij u_j.
    - `C` (s, s), strictly lower: stage i's right-hand side has M Σ_j C_ij u_j / h.
    - `c` (s,): stage times t0 + c_i h; `d` (s,): stage i's right-hand side has h d_i ∂f/∂t.
    - `m` (s,): y1 = y0 + Σ_j m_j u_j; `error` (s,): the local error estimate Σ_j error_j u_j.
    - `dense` (q, s): the dense output's coefficient vectors K_r = Σ_j dense_rj u_j, for
      y(t0 + θh) = (1 − θ) y0 + θ (y1 + (1 − θ)(K_0 + θ K_1 + … + θ^{q−1} K_{q−1})).
    - `order`, `embedded_order`: of y1 and of the embedded solution y1 − error.
    """

    gamma: float
    a: np.ndarray
    C: np.ndarray
    c: np.ndarray
    d: np.ndarray
    m: np.ndarray
    error: np.ndarray
    dense: np.ndarray
    order: int
    embedded_order: int

    @property
    def num_stages(self) -> int:
        return self.c.size


def _stiffly_accurate(gamma, a, C, c, d, dense, order, embedded_order):
    """The tableau of a Rodas method from the rows of `a` of stages 2 … r (lower triangles), all
    s − 1 rows of C, the stage times c_2 … and the d_1 … given. Stages r + 1 … s each append the
    previous stage to the previous argument; the stage times not given are 1 (c_1 = 0), the d not
    given are 0."""
    s = len(C) + 1
    unit = np.eye(s)
    lower = np.zeros((s, s))
    for i, row in enumerate(a, start=1):
        lower[i, : len(row)] = row
    for i in range(len(a) + 1, s):
        lower[i] = lower[i - 1] + unit[i - 1]
    C_full = np.zeros((s, s))
    for i, row in enumerate(C, start=1):
        C_full[i, : len(row)] = row
    return RosenbrockTableau(
        gamma=gamma,
        a=lower,
        C=C_full,
        c=np.array([0.0, *c, *[1.0] * (s - 1 - len(c))]),
        d=np.array([*d, *[0.0] * (s - len(d))]),
        m=lower[s - 1] + unit[s - 1],
        error=unit[s - 1],
        dense=np.array(dense),
        order=order,
        embedded_order=embedded_order,
    )


# E. Hairer, G. Wanner, Solving Ordinary Differential Equations II, 2nd ed. (Springer 1996), §VI.4,
# Table 4.3 and their code RODAS: 6 stages, order 4 (3 embedded), dense output of order 3.
RODAS4 = _stiffly_accurate(
    gamma=0.25,
    a=[
        [1.544],
        [0.9466785280815826, 0.2557011698983284],
        [3.314825187068521, 2.896124015972201, 0.9986419139977817],
        [1.221224509226641, 6.019134481288629, 12.53708332932087, -0.6878860361058950],
    ],
    C=[
        [-5.6688],
        [-2.430093356833875, -0.2063599157091915],
        [-0.1073529058151375, -9.594562251023355, -20.47028614809616],
        [7.496443313967647, -10.24680431464352, -33.99990352819905, 11.70890893206160],
        [8.083246795921522, -7.981132988064893, -31.52159432874371, 16.31930543123136, -6.058818238834054],
    ],
    c=[0.386, 0.21, 0.63],
    d=[0.25, -0.1043, 0.1035, -0.03620000000000023],
    dense=[
        [10.12623508344586, -7.487995877610167, -34.80091861555747, -7.992771707568823, 1.025137723295662, 0.0],
        [-0.6762803392801253, 6.087714651680015, 16.43084320892478, 24.76722511418386, -6.594389125716872, 0.0],
    ],
    order=4,
    embedded_order=3,
)


# G. Steinebach, "Construction of Rosenbrock–Wanner method Rodas5P and numerical benchmarks within
# the Julia Differential Equations package", BIT Numerical Mathematics 63:27 (2023),
# doi:10.1007/s10543-023-00967-x: 8 stages, order 5 (4 embedded), dense output of order 4.
RODAS5P = _stiffly_accurate(
    gamma=0.21193756319429014,
    a=[
        [3.0],
        [2.849394379747939, 0.45842242204463923],
        [-6.954028509809101, 2.489845061869568, -10.358996098473584],
        [2.8029986275628964, 0.5072464736228206, -0.3988312541770524, -0.04721187230404641],
        [-7.502846399306121, 2.561846144803919, -11.627539656261098, -0.18268767659942256, 0.030198172008377946],
    ],
    C=[
        [-14.155112264123755],
        [-17.97296035885952, -2.859693295451294],
        [147.12150275711716, -1.41221402718213, 71.68940251302358],
        [165.43517024871676, -0.4592823456491126, 42.90938336958603, -5.961986721573306],
        [24.854864614690072, -3.0009227002832186, 47.4931110020768, 5.5814197821558125, -0.6610691825249471],
        [
            30.91273214028599,
            -3.1208243349937974,
            77.79954646070892,
            34.28646028294783,
            -19.097331116725623,
            -28.087943162872662,
        ],
        [
            37.80277123390563,
            -3.2571969029072276,
            112.26918849496327,
            66.9347231244047,
            -40.06618937091002,
            -54.66780262877968,
            -9.48861652309627,
        ],
    ],
    c=[0.6358126895828704, 0.4095798393397535, 0.9769306725060716, 0.4288403609558664],
    d=[0.21193756319429014, -0.42387512638858027, -0.3384627126235924, 1.8046452872882734, 2.325825639765069],
    dense=[
        [
            25.948786856663858,
            -2.5579724845846235,
            10.433815404888879,
            -2.3679251022685204,
            0.524948541321073,
            1.1241088310450404,
            0.4272876194431874,
            -0.17202221070155493,
        ],
        [
            -9.91568850695171,
            -0.9689944594115154,
            3.0438037242978453,
            -24.495224566215796,
            20.176138334709044,
            15.98066361424651,
            -6.789040303419874,
            -6.710236069923372,
        ],
        [
            11.419903575922262,
            2.8879645146136994,
            72.92137995996029,
            80.12511834622643,
            -52.072871366152654,
            -59.78993625266729,
            -0.15582684282751913,
            4.883087185713722,
        ],
    ],
    order=5,
    embedded_order=4,
)
